"""vllm_service's check that the instances' CPU KV tiers fit in /dev/shm before any (re)start.

The /dev/shm sizes are the ones recorded on real hosts (tests/fixtures/probe/h200-shm/host-state-h200-shm.txt:
two stacked tmpfs mounts on the H200 guest; a systemd-nspawn lab host's 10 % of RAM, 2527653888 B)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from pluginload import load_plugin

from vllm_fleet.deploy.service import shm_shortfall, with_drifted
from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.probe.topology import build_topology_from_dir

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
LAB_SHM = 2527653888  # findmnt in a lab host (nspawn mounts /dev/shm at 10 % of the host's RAM)
H200_FINDMNT = "137438953472\n137438953472\n"  # the H200 guest's two mounts, the top one last
H200X2 = ROOT / "tests" / "fixtures" / "topology" / "recorded" / "h200x2"


def _filters():
    return load_plugin(ROOT / "plugins" / "filter" / "vllm_service.py", "vllm_service_filters")


def _filter():
    return _filters().vllm_service_shm_shortfall


def _h200_plan(tier: int, version: str = "0.33.0", **more: object):
    """The recorded 2 x H200 host's plan (one TP2 instance over NV18) with a CPU KV tier of `tier` bytes."""
    variables = {
        "vllm_service_model": "/m",
        "vllm_service_host": "127.0.0.1",
        "vllm_service_kv_offload_cpu_bytes": tier,
        **more,
    }
    return build_host_plan("h200", variables, build_topology_from_dir(H200X2), vllm_version=version)


def test_tiers_that_fit_pass_and_ones_that_do_not_are_refused_with_the_fix() -> None:
    assert shm_shortfall(_h200_plan(2 * GiB).needs.shm_bytes, LAB_SHM, "0.32.0") == ""
    two = _h200_plan(2 * GiB, vllm_service_tensor_parallel_size=1)  # two TP1 instances: two tiers
    assert [i.name for i in two.instances] == ["i0", "i1"] and two.needs.shm_bytes == 4 * GiB
    message = shm_shortfall(two.needs.shm_bytes, LAB_SHM, "0.32.0+cpu")
    assert message.startswith("vllm_service_kv_offload_cpu_bytes: the instances' CPU KV tiers need 4.00 GiB")
    assert "in /dev/shm, where vLLM 0.32.0 maps them" in message and "holds 2.35 GiB" in message
    assert "run playbooks/tune.yml first" in message and "Nothing was changed." in message


def test_releases_that_keep_the_tier_elsewhere_and_hosts_without_a_tier_pass() -> None:
    assert _h200_plan(100 * GiB, "0.19.0").needs.shm_bytes == 0  # pinned torch pages, not /dev/shm
    assert _h200_plan(100 * GiB, "0.20.0").needs.shm_bytes == 100 * GiB
    assert shm_shortfall(_h200_plan(100 * GiB, "0.20.0").needs.shm_bytes, LAB_SHM, "0.20.0") != ""
    assert shm_shortfall(0, LAB_SHM, "0.33.0") == ""
    assert shm_shortfall(100 * GiB, None, "0.33.0") == ""  # no /dev/shm tmpfs: nothing to judge


def test_the_filter_reads_findmnt_and_the_plan() -> None:
    shortfall = _filter()
    assert shortfall(H200_FINDMNT, _h200_plan(64 * GiB).to_dict()) == ""
    assert "130.00 GiB in /dev/shm" in shortfall(
        H200_FINDMNT, _h200_plan(65 * GiB, vllm_service_tensor_parallel_size=1).to_dict()
    )
    assert shortfall("", _h200_plan(65 * GiB).to_dict()) == ""
    with pytest.raises(AnsibleFilterError, match="vllm_service_host_plan: not a host plan"):
        shortfall(H200_FINDMNT, {"instances": []})


def test_a_unit_file_rewritten_on_the_host_restarts_its_instance() -> None:
    """A unit whose recorded digest matches but whose file had to be rewritten (hand-edited, another tool's)
    does not run the plan: it joins the restart list, once."""
    drifted = [("i0", "vllm-fleet-i0.service")]  # the unit files that differ from the plan on the host
    todo = with_drifted([], drifted)
    assert todo == [
        {
            "name": "i0",
            "unit": "vllm-fleet-i0.service",
            "action": "restarted",
            "why": "its unit file on the host differed from the plan",
        }
    ]
    already = [{"name": "i0", "unit": "vllm-fleet-i0.service", "action": "started", "why": "it is failed"}]
    assert with_drifted(already, drifted) == already


@pytest.mark.parametrize("pin", ["0.32", "0.32.0", "0.32.0+cpu"])
def test_a_minor_release_pin_plans_what_the_installed_release_plans(pin: str) -> None:
    """`vllm_install_version: "0.32"` installs 0.32.0 (pip pads the release): deploy.yml alone plans for the
    pin, site.yml for the installed version; the plans must be the same (a difference restarts every
    instance) and the installed release must count as the planned one."""
    planned, installed = _h200_plan(0, pin), _h200_plan(0, "0.32.0+cpu")
    assert planned.vllm_version == "0.32.0"
    assert planned.to_dict() == installed.to_dict()
    same_release = _filters().vllm_service_same_release
    assert same_release("0.32.0+cpu", pin)
    assert not same_release("0.32.1", pin)
