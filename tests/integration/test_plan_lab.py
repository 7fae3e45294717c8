"""One plan per host, against a fresh lab host (real systemd, apt, sshd; nothing of vllm-fleet installed yet)
and the shared installed lab.

- site.yml with one bad variable of any role stops in preflight, naming the variable; the host is left
  exactly as it was (no service user, no venv, no /etc/vllm-fleet, root's account as it was, no file under
  /etc, /opt, /usr, /boot or /srv newer than the run): the roles' argument specs and every variable's kind
  (vllm_fleet.validate: a root install user, a dist-info alias out of the venv, a verify address off the
  host) are checked by the plan before the first play that changes anything;
- a max_model_len beyond what the model's own config.json supports is refused from that config.json, read
  from the host (read-only) before anything is installed;
- site.yml converges a lab host with vLLM installed (its own: tests/integration/conftest.py's
  own_installed_lab); the plan deploy writes (/etc/vllm-fleet/i0.json) is the plan preflight wrote
  (reports/plan/<host>.json) and the plan `vllm-fleet plan --inventory` prints for the same inventory; a
  second site.yml changes nothing, restarts nothing and sends no test requests (the light re-check); a
  sysctl file and the unit edited by hand are written back in one run, the instance restarted on the
  planned unit and fully checked again; `--tags tune` plans first and tunes alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# VLLM_FLEET_PLAN_LAB: another name, for a session that may use only labs of its own
LAB = os.environ.get("VLLM_FLEET_PLAN_LAB", "plan-it")
CONVERGE_LAB = f"{LAB}-cv"
LAB_ROOT = Path(os.environ.get("VLLM_FLEET_LAB_ROOT", "/var/lib/vllm-fleet-lab"))
NOTHING_INSTALLED = (
    "! id vllm >/dev/null 2>&1 && test ! -e /opt/vllm-fleet && test ! -e /etc/vllm-fleet && echo untouched"
)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(argv: list[str], timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def site(inv: Path, reports: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inv),
            "site.yml",
            "-e",
            f"vllm_fleet_report_dir={reports}",
            "-e",
            f"vllm_verify_report_dir={reports}/verify",
            *extra,
        ]
    )


def recap(proc: subprocess.CompletedProcess[str], name: str) -> dict[str, int]:
    line = proc.stdout.split("PLAY RECAP")[-1].split("\n")
    host = next(part for part in line if part.startswith(name))
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", host)}


def on_host(inv: Path, command: str) -> str:
    proc = run(
        [str(BIN / "ansible"), "-i", str(inv), "all", "-o", "-m", "ansible.builtin.shell", "-a", command]
    )
    out = proc.stdout.split("(stdout) ", 1)[-1] if "(stdout) " in proc.stdout else proc.stdout
    return out.replace("\\n", "\n").strip()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, systemd-nspawn)")
    work = tmp_path_factory.mktemp("plan-lab")
    inventory = work / "inventory.yml"
    (work / "group_vars" / "lab").mkdir(parents=True)
    shutil.copy(
        ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml", work / "group_vars" / "lab" / "vllm.yml"
    )
    up = run(
        [str(BIN / "vllm-fleet"), "lab", "up", "--name", LAB, "--hosts", "1", "--inventory", str(inventory)]
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield inventory, work
    finally:
        run([str(BIN / "vllm-fleet"), "lab", "down", "--name", LAB], timeout=300)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("gpu_topology_show_report", "loudly"),
        ("nvidia_driver_mode", "upgrade"),
        ("cuda_toolkit_enabled", "perhaps"),
        ("vllm_install_pip_timeout", "long"),
        ("host_tuning_thp_enabled", "sometimes"),
        ("vllm_service_start_timeout", "soon"),
        ("vllm_service_manage_state", "maybe"),
        ("vllm_verify_ready_timeout", "later"),
        ("vllm_rollout_history_keep", "all"),
        ("vllm_service_max_model_len", "4096"),  # the tiny model has 2,048 positions (its config.json)
        # issue 31: refused by kind or policy (vllm_fleet.validate), not by type
        ("vllm_install_user", "root"),  # the install would have made root's shell nologin
        ("vllm_install_dist_alias", "../../../../../../etc/cron.d/x"),
        ("vllm_verify_address", "attacker.example.com"),  # the API key would be sent there
    ],
)
def test_a_bad_variable_stops_site_yml_in_preflight_before_any_change(
    lab: tuple[Path, Path], variable: str, value: str
) -> None:
    inventory, work = lab
    root_before = on_host(inventory, "getent passwd root")
    on_host(inventory, "touch /run/vllm-fleet-before-bad-run")
    proc = site(inventory, work / "bad", "-e", f"{variable}={value}")
    assert proc.returncode != 0, proc.stdout[-3000:]
    failed = proc.stdout.split("fatal: ", 1)[-1]
    # every role's variables are refused by preflight's first task (vllm_fleet_validate: the argument specs'
    # types, then each variable's kind), before the probe; what needs the model's config.json by the plan
    assert variable in failed and value in failed, proc.stdout[-3000:]
    assert "vllm_fleet_validate" in failed or "vllm_fleet_plan" in failed, proc.stdout[-3000:]
    assert "PLAY [NVIDIA driver" not in proc.stdout  # no play after preflight started
    assert on_host(inventory, NOTHING_INSTALLED).endswith("untouched")
    assert on_host(inventory, "getent passwd root") == root_before
    newer = "find /etc /opt /usr /boot /srv -xdev -newer /run/vllm-fleet-before-bad-run -print; echo end"
    assert on_host(inventory, newer) == "end"


def _only_host(inventory: Path) -> str:
    listed = run([str(BIN / "ansible-inventory"), "-i", str(inventory), "--list"])
    assert listed.returncode == 0, listed.stderr
    (host,) = json.loads(listed.stdout)["_meta"]["hostvars"]
    return host


@pytest.fixture(scope="module")
def converge_lab(own_installed_lab, tmp_path_factory: pytest.TempPathFactory):
    """A lab host of its own with vLLM installed (tests/integration/conftest.py: own_installed_lab): the
    site.yml runs below take about ten minutes, which the shared lab's serial run (the suite's long pole,
    tests/conftest.py) need not carry."""
    with own_installed_lab(CONVERGE_LAB, tmp_path_factory.mktemp("plan-converge")) as installed:
        yield installed


def test_converged_host_runs_the_plan_as_written_and_a_rerun_changes_nothing(
    converge_lab, tmp_path: Path
) -> None:
    """On a lab host with vLLM installed: site.yml tunes, deploys and verifies."""
    inventory = converge_lab.inventory
    name = _only_host(inventory)
    reports = tmp_path / "reports"
    first = site(inventory, reports)
    assert first.returncode == 0, first.stdout[-5000:]
    host = next(iter(json.loads((reports / "plan" / f"{name}.json").read_text())["instances"]))
    deployed = json.loads(on_host(inventory, "cat /etc/vllm-fleet/i0.json"))
    assert deployed == host
    # The CLI plans the same host from the facts preflight kept and the tiny model's config.json on the
    # controller (the lab's cached copy of what the host reads), without touching the host: a copy of the
    # inventory with that one variable added.
    copy = tmp_path / "inventory"
    if inventory.is_dir():
        shutil.copytree(inventory, copy, ignore=shutil.ignore_patterns("examples"))
    else:  # a lab's own inventory file (VLLM_FLEET_LAB_INVENTORY)
        copy.mkdir()
        shutil.copy(inventory, copy / inventory.name)
    (config,) = LAB_ROOT.glob("cache/model-tiny-*/config.json")
    (copy / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (copy / "group_vars" / "all" / "zz-model.yml").write_text(
        yaml.safe_dump({"vllm_service_model_config": str(config)})
    )
    cli = run(
        [
            str(BIN / "vllm-fleet"),
            "plan",
            "--inventory",
            str(copy),
            "--facts",
            str(reports / "probe"),
            "--json",
        ]
    )
    assert cli.returncode == 0, cli.stderr
    planned = json.loads(cli.stdout)["hosts"][name]["instances"][0]
    assert planned == host

    before = on_host(inventory, "systemctl show -p InvocationID --value vllm-fleet-i0")
    verified = json.loads((reports / "verify" / f"{name}--i0.json").read_text())
    assert verified["full"] and verified["verified_start"]["invocation_id"] == before
    second = site(inventory, reports)
    assert second.returncode == 0, second.stdout[-5000:]
    assert recap(second, name)["changed"] == 0, second.stdout[-5000:]
    assert on_host(inventory, "systemctl show -p InvocationID --value vllm-fleet-i0") == before
    # The same start of the same plan passed the full checks: the re-run sends no test requests, and still
    # checks what a running instance can lose.
    rechecked = json.loads((reports / "verify" / f"{name}--i0.json").read_text())
    assert rechecked["ok"] and not rechecked["full"], rechecked["checks"]
    assert rechecked["verified_start"] == verified["verified_start"]
    names = {check["name"] for check in rechecked["checks"]}
    assert {"readiness", "restarts", "api_health", "api_models_served_name", "api_metrics"} <= names
    assert "api_completion" not in names and "ttft_p99" not in names

    # Drift on the converged host is still found, in one run (each site.yml here costs a vLLM start): a
    # sysctl file edited by hand is written back by host_tuning, and a unit edited by hand (and reloaded, as
    # an operator would) is written back and its instance restarted on the unit the plan gives, though the
    # plan's digest did not change; the new start gets the full checks (the test requests included) again.
    sysctl_file = "/etc/sysctl.d/90-vllm-fleet.conf"
    unit_file = "/etc/systemd/system/vllm-fleet-i0.service"
    tuned = on_host(inventory, f"cat {sysctl_file}")
    assert "kernel.numa_balancing = 0" in tuned
    unit = on_host(inventory, f"cat {unit_file}")
    on_host(
        inventory,
        f"echo 'kernel.numa_balancing = 1' > {sysctl_file} && "
        f"sed -i 's/^Description=.*/Description=edited by hand/' {unit_file} && systemctl daemon-reload",
    )
    third = site(inventory, reports)
    assert third.returncode == 0, third.stdout[-5000:]
    assert recap(third, name)["changed"] > 0, third.stdout[-5000:]
    assert on_host(inventory, f"cat {sysctl_file}") == tuned
    assert on_host(inventory, f"cat {unit_file}") == unit
    assert on_host(inventory, "systemctl show -p Description --value vllm-fleet-i0") != "edited by hand"
    restarted = on_host(inventory, "systemctl show -p InvocationID --value vllm-fleet-i0")
    assert restarted not in ("", before)
    again = json.loads((reports / "verify" / f"{name}--i0.json").read_text())
    assert again["ok"] and again["full"] and again["verified_start"]["invocation_id"] == restarted
    assert "api_completion" in {check["name"] for check in again["checks"]}

    # One stage by its tag plans first (preflight runs under any --tags: every stage reads the plan), and
    # writes the hand-edited sysctl back without the other stages.
    on_host(inventory, f"echo 'kernel.numa_balancing = 1' > {sysctl_file}")
    tune_only = site(inventory, reports, "--tags", "tune")
    assert tune_only.returncode == 0, tune_only.stdout[-5000:]
    assert "TASK [Build this host's plan and check every role's variables]" in tune_only.stdout
    assert "TASK [vllm_fleet.serving.vllm_service" not in tune_only.stdout, tune_only.stdout[-5000:]
    assert recap(tune_only, name)["changed"] > 0, tune_only.stdout[-5000:]
    assert on_host(inventory, f"cat {sysctl_file}") == tuned
