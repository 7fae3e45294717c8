"""vllm_service's check that the instances' CPU KV tiers fit in /dev/shm before any (re)start.

The /dev/shm sizes are the ones recorded on real hosts (tests/fixtures/probe/h200-shm/host-state-h200-shm.txt:
two stacked tmpfs mounts on the H200 guest; a systemd-nspawn lab host's 10 % of RAM, 2527653888 B)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy.service import shm_shortfall

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
LAB_SHM = 2527653888  # findmnt in a lab host (nspawn mounts /dev/shm at 10 % of the host's RAM)
H200_FINDMNT = "137438953472\n137438953472\n"  # the H200 guest's two mounts, the top one last


def _filter():
    path = ROOT / "roles" / "vllm_service" / "filter_plugins" / "vllm_service.py"
    spec = importlib.util.spec_from_file_location("vllm_service_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.vllm_service_shm_shortfall


def test_tiers_that_fit_pass_and_ones_that_do_not_are_refused_with_the_fix() -> None:
    assert shm_shortfall(1 * GiB, 2, LAB_SHM, "0.32.0") == ""
    message = shm_shortfall(2 * GiB, 2, LAB_SHM, "0.32.0+cpu")
    assert message.startswith("vllm_service_kv_offload_cpu_bytes: 2 instance(s) x 2.00 GiB of CPU KV")
    assert "4.00 GiB in /dev/shm, where vLLM 0.32.0 maps it" in message and "holds 2.35 GiB" in message
    assert "run playbooks/tune.yml first" in message and "Nothing was changed." in message


def test_releases_that_keep_the_tier_elsewhere_and_hosts_without_a_tier_pass() -> None:
    assert shm_shortfall(100 * GiB, 2, LAB_SHM, "0.19.0") == ""  # pinned torch pages, not /dev/shm
    assert shm_shortfall(100 * GiB, 2, LAB_SHM, "0.20.0") != ""
    assert shm_shortfall(0, 2, LAB_SHM, "0.33.0") == ""
    assert shm_shortfall(100 * GiB, 2, None, "0.33.0") == ""  # no /dev/shm tmpfs: nothing to judge


def test_the_filter_reads_findmnt_and_the_variable_as_written() -> None:
    shortfall = _filter()
    assert shortfall(H200_FINDMNT, "64GiB", 1, "0.33.0") == ""
    assert "130.00 GiB in /dev/shm" in shortfall(H200_FINDMNT, "65GiB", 2, "0.33.0")
    assert shortfall("", "65GiB", 2, "0.33.0") == ""
    with pytest.raises(AnsibleFilterError, match="vllm_service_kv_offload_cpu_bytes"):
        shortfall(H200_FINDMNT, "lots", 1, "0.33.0")
