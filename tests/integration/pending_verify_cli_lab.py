"""NOT COLLECTED (not test_*.py) until it has passed in a lab: rename it to test_verify_cli_lab.py then.
This version runs the CLI inside the lab's control namespace (the earlier one, at 0d09776, did not).

`vllm-fleet verify --url` against the lab's running vLLM gives the role's verdict on that instance.

One lab host (the `lab` fixture of test_verify_lab.py: `vllm-fleet lab up`, vLLM installed by
playbooks/install.yml; VLLM_FLEET_VERIFY_INVENTORY reuses a lab that is up), instance i0 deployed by
playbooks/deploy.yml with the lab's variables (vLLM listens on 0.0.0.0:8000). Then, on the same start:

- the role (playbooks/verify.yml) checks it on the host and saves its report;
- the CLI, on the controller, reads the plan the role read (/etc/vllm-fleet/i0.json) and the journal of the
  same start (fetched as text, as a container's log would be), and calls the API across the lab's network
  from inside the lab's control namespace (`ip netns exec vfl-<lab>.ctl`: the lab's addresses exist only
  there).

Both must give the same checks with the same verdicts, except `restarts`, which only systemd can answer.
Run under the shared lab lock: `flock /tmp/vllm-fleet-lab.lock .venv/bin/pytest tests/integration/...`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vllm_fleet.lab.spec import NETNS_PREFIX

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The lab and its helpers are test_verify_lab.py's (loaded by path: tests/integration is no package). When the
# shared installed lab for all integration tests lands, point `lab` at it here; nothing else changes.
_SPEC = importlib.util.spec_from_file_location("verify_lab", Path(__file__).with_name("test_verify_lab.py"))
_verify_lab = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_verify_lab)
_verify_lab.LAB = "gpu18-verify-cli"  # its own lab name, so it never tears down another test's lab
lab = _verify_lab.lab
BIN, on_host, playbook, report_of, run, verify = (
    _verify_lab.BIN,
    _verify_lab.on_host,
    _verify_lab.playbook,
    _verify_lab.report_of,
    _verify_lab.run,
    _verify_lab.verify,
)


def _lab_host(inv: Path) -> tuple[str, str]:
    """(the lab host's address, the lab's control namespace), from the inventory as Ansible reads it. The
    address is reachable only inside the lab's namespaces: the CLI runs in the control namespace (the
    controller's own routing table would send it off this machine)."""
    listed = run([str(BIN / "ansible-inventory"), "-i", str(inv), "--list"])
    assert listed.returncode == 0, listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    (host_vars,) = hostvars.values()
    return str(host_vars["ansible_host"]), f"{NETNS_PREFIX}{host_vars['vllm_fleet_lab_name']}.ctl"


def test_cli_gives_the_roles_verdict_on_the_same_instance(lab) -> None:
    inv, work = lab
    lab_vars = "@inventory/group_vars/lab/vllm.yml"
    deployed = playbook(inv, "playbooks/deploy.yml", "-e", lab_vars, timeout=1800)
    assert deployed.returncode == 0, deployed.stdout[-4000:]
    reports = work / "reports-role"
    role = verify(inv, reports, "-e", lab_vars)
    assert role.returncode == 0, role.stdout[-6000:]
    by_role = report_of(reports)

    plan = work / "i0.json"
    plan.write_text(on_host(inv, work / "tree", "cat /etc/vllm-fleet/i0.json")["stdout"])
    invocation = by_role["readiness"]["invocation_id"]
    journal = on_host(
        inv, work / "tree", f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}"
    )["stdout"]
    log = work / "i0.log"
    log.write_text(journal + "\n")

    address, netns = _lab_host(inv)
    url = f"http://{address}:8000"
    command = [str(BIN / "vllm-fleet"), "verify", "--plan", str(plan), "--log", str(log), "--url", url]
    cli = run(["ip", "netns", "exec", netns, *command, "--json"], timeout=600)
    assert cli.returncode == 0, cli.stdout[-4000:] + cli.stderr[-2000:]
    by_cli = json.loads(cli.stdout)

    def verdicts(report: dict) -> dict[str, bool]:
        return {c["name"]: c["ok"] for c in report["checks"] if c["name"] != "restarts"}

    assert verdicts(by_cli) == verdicts(by_role)
    assert "restarts" in {c["name"] for c in by_role["checks"]}
    assert "restarts" not in {c["name"] for c in by_cli["checks"]}
    seen = {c["name"]: c["seen"] for c in by_cli["checks"]}
    role_seen = {c["name"]: c["seen"] for c in by_role["checks"]}
    for name in ("kv_cache_tokens", "max_concurrency", "kv_cache_dtype", "api_models_served_name"):
        assert seen[name] == role_seen[name], name
    assert by_cli["metrics"]["prefix_cache_hits"] > 0 and by_role["metrics"]["prefix_cache_hits"] > 0
    assert by_cli["target"]["base_url"] == url
    # the CLI reads only: the instance still runs the start the role verified
    show = on_host(inv, work / "tree", "systemctl show -p InvocationID vllm-fleet-i0.service")["stdout"]
    assert show.strip() == f"InvocationID={invocation}"
