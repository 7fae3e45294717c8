"""Sizes and human-readable ints, read as vLLM's `human_readable_int` reads them (vllm-facts §1)."""

from __future__ import annotations

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.sizes import format_bytes, format_count, parse_human_int, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10737418240", 10 * 2**30),
        ("10GiB", 10 * 2**30),
        ("10 GiB", 10 * 2**30),
        ("10G", 10 * 2**30),
        ("10g", 10 * 10**9),
        ("10GB", 10 * 10**9),
        ("1.5g", 1_500_000_000),
        ("200GiB", 214_748_364_800),  # the seed's cpu_bytes_to_use
        ("112.61 GiB", int(112.61 * 2**30)),
        ("512K", 512 * 1024),
        ("2T", 2 * 2**40),
        ("64MiB", 64 * 2**20),
        (1024, 1024),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("32k", 32_000), ("32K", 32_768), ("8192", 8192), ("750000", 750_000)]
)
def test_parse_human_int_is_vllms(text: str, expected: int) -> None:
    assert parse_human_int(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-5", "10 G", "10XB", "1e9", "ten", "10GiBs"])
def test_garbage_is_rejected_naming_the_input(bad: str) -> None:
    with pytest.raises(FleetInputError, match="--kv-bytes-per-gpu"):
        parse_size(bad, "--kv-bytes-per-gpu")


def test_fraction_with_binary_suffix_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(FleetInputError, match=r"binary suffix .G.*decimal suffix .g."):
        parse_size("1.5G", "--kv-cache-memory-bytes")
    with pytest.raises(FleetInputError, match="max-model-len"):
        parse_human_int("32KiB", "--max-model-len")  # spelled units are sizes, not vLLM ints


@pytest.mark.parametrize("bad", [True, -1])
def test_non_numbers_and_negatives(bad: object) -> None:
    with pytest.raises(FleetInputError):
        parse_size(bad)  # type: ignore[arg-type]


def test_format() -> None:
    assert format_bytes(10 * 2**30) == "10 GiB"
    assert format_bytes(55_354_327_040) == "51.55 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(-2 * 2**20) == "-2 MiB"
    assert format_count(1_048_576) == "1,048,576"
