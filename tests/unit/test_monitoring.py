"""`vllm-fleet monitoring`: the files it writes for inventory/examples/seed-4x4090, checked by
Prometheus's own promtool (Debian's `prometheus` package: `apt-get install prometheus`), the
alerts fired and resolved by `promtool test rules` on synthetic series
labelled exactly as the generated scrape config labels them.

No GPU is needed: the seed's plan comes from recorded outputs
(inventory/examples/8x4090-dual-socket/recorded).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_fleet.monitoring.dashboard import dashboard, expressions
from vllm_fleet.monitoring.rules import Limits, limits_from, rule_file
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.verify.report import Thresholds

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "inventory" / "examples" / "seed-4x4090"
EXAMPLE = ROOT / "examples" / "monitoring" / "seed-4x4090"
CLI = Path(sys.executable).with_name("vllm-fleet")
FILES = ("prometheus.yml", "rules/vllm-fleet.rules.yml", "grafana/vllm-fleet.json")


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool missing: apt-get install prometheus (Debian's package ships it)")
    return path


def generate(inventory: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "monitoring", "--inventory", str(inventory), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def seed_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("seed-monitoring")
    done = generate(SEED, out)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def seed_plans() -> dict[str, HostPlan]:
    done = subprocess.run(
        [str(CLI), "plan", "--inventory", str(SEED), "--json"], capture_output=True, text=True, timeout=120
    )
    data = json.loads(done.stdout)["hosts"]
    return {host: HostPlan.from_dict(plan) for host, plan in data.items()}


def test_committed_example_is_what_the_command_writes(seed_out: Path) -> None:
    for name in FILES:
        assert (seed_out / name).read_text() == (EXAMPLE / name).read_text(), (
            f"{EXAMPLE / name} is stale: vllm-fleet monitoring --inventory {SEED.relative_to(ROOT)} "
            f"--out {EXAMPLE.relative_to(ROOT)}"
        )


def test_every_planned_instance_is_a_target_with_the_plans_labels(seed_out: Path, seed_plans) -> None:
    config = yaml.safe_load((seed_out / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job["static_configs"] for job in config["scrape_configs"]}
    planned = [i for plan in seed_plans.values() for i in plan.instances]
    assert len(jobs["vllm"]) == len(planned) == 2
    for instance, static in zip(planned, jobs["vllm"], strict=True):
        # the seed listens on 0.0.0.0: Prometheus dials the host's ansible_host at the planned port
        assert static["targets"] == [f"192.0.2.10:{instance.port}"]
        assert static["labels"] == {
            "fleet": "seed-4x4090",
            "host": "seed-4090",
            "instance": instance.name,
            "model": "qwen3-27b",
            "tp": "4",
            "numa_node": str(instance.numa_binding["nodes"][0]),
            "vllm_release": instance.vllm_version,
            "unit": instance.unit,
        }
    assert [s["targets"] for s in jobs["node"]] == [["192.0.2.10:9100"]]
    assert [s["targets"] for s in jobs["gpu"]] == [["192.0.2.10:9400"]]


def test_promtool_accepts_the_config_and_the_rules(seed_out: Path) -> None:
    config = subprocess.run(
        [promtool(), "check", "config", str(seed_out / "prometheus.yml")], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr
    rules = subprocess.run(
        [promtool(), "check", "rules", str(seed_out / "rules" / "vllm-fleet.rules.yml")],
        capture_output=True,
        text=True,
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_thresholds_come_from_the_plan(seed_out: Path) -> None:
    rules = yaml.safe_load((seed_out / "rules" / "vllm-fleet.rules.yml").read_text())
    by_name = {
        (r.get("alert") or r["record"], r.get("labels", {}).get("instance")): r
        for g in rules["groups"]
        for r in g["rules"]
    }
    # gpu_kv_tokens and the concurrency at the average input the plan sized i0 for (1,269,111; 22.75)
    assert by_name[("vllm_fleet:planned_gpu_kv_tokens", "i0")]["expr"] == "vector(1269111)"
    assert by_name[("vllm_fleet:planned_cpu_kv_bytes", "i0")]["expr"] == "vector(214748364800)"
    assert by_name[("VllmRequestsQueueing", "i0")]["expr"].endswith("> 22")
    assert by_name[("vllm_fleet:planned_waiting_max", "i0")]["expr"] == "vector(22)"  # the same mark, drawn
    assert 'name="vllm-fleet-i1.service"' in by_name[("VllmInstanceRestarted", "i1")]["expr"]
    # verify's marks: spec acceptance 0.3, restarts 0; TTFT judged off by verify, so monitoring's 2 s
    assert by_name[("VllmSpecAcceptanceLow", "i0")]["expr"].endswith("< 0.3")
    assert by_name[("VllmInstanceRestarted", "i0")]["expr"].endswith("> 0")
    assert by_name[("VllmTTFTP99High", "i0")]["expr"].endswith("> 2")


def test_features_the_plan_leaves_off_get_no_alert_and_no_panel(seed_plans) -> None:
    data = next(iter(seed_plans.values())).to_dict()
    for instance in data["instances"]:
        instance["spec_decode"] = False
        instance["prefix_caching"] = False
        instance["needs"]["cpu_kv_bytes"] = 0
    data["cpu_only"] = True
    plans = {data["host"]: HostPlan.from_dict(data)}
    alerts = {r.get("alert") for g in rule_file(plans, "f", Limits())["groups"] for r in g["rules"]}
    assert {"VllmSpecAcceptanceLow", "VllmPrefixHitRateLow", "VllmCPUOffloadAllocationFailing"}.isdisjoint(
        alerts
    )
    exprs = " ".join(expressions(dashboard(plans)))
    for metric in ("spec_decode", "kv_offload", "prefix_cache_hits", "gpu_utilization"):
        assert metric not in exprs
    full = " ".join(expressions(dashboard(seed_plans)))
    for metric in ("spec_decode", "kv_offload", "prefix_cache_hits", "gpu_utilization"):
        assert metric in full


def test_verify_marks_set_in_the_inventory_reach_the_rules(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(SEED.parent, examples)
    (examples / "seed-4x4090" / "group_vars" / "all" / "verify.yml").write_text(
        "vllm_verify_spec_acceptance_min: 0.6\nvllm_verify_ttft_p99_max: 1.5\nvllm_verify_max_restarts: 2\n"
    )
    done = generate(examples / "seed-4x4090", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "rules" / "vllm-fleet.rules.yml").read_text()
    assert (
        'vllm_fleet:spec_decode_acceptance_rate:ratio_5m{fleet="seed-4x4090", host="seed-4090", '
        'instance="i0"} < 0.6' in text
    )
    assert 'instance="i0"} > 1.5' in text
    assert "[1h]) > 2" in text


def test_a_bad_verify_mark_names_the_variable(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(SEED.parent, examples)
    (examples / "seed-4x4090" / "group_vars" / "all" / "verify.yml").write_text(
        "vllm_verify_max_restarts: many\n"
    )
    done = generate(examples / "seed-4x4090", tmp_path / "out")
    assert done.returncode == 2
    assert "vllm_verify_max_restarts" in done.stderr and "seed-4090" in done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_scrape_interval_is_refused_before_writing(tmp_path: Path) -> None:
    done = generate(SEED, tmp_path / "out", "--scrape-interval", "fast")
    assert done.returncode == 2
    assert "--scrape-interval: 'fast' is no duration" in done.stderr
    assert not (tmp_path / "out").exists()


def test_saved_plans_give_the_same_files(seed_out: Path, tmp_path: Path) -> None:
    """--plans: the plans preflight saved (here `plan --json`'s, the same HostPlan.to_dict) give the files
    planning from the inventory gives."""
    done = subprocess.run(
        [str(CLI), "plan", "--inventory", str(SEED), "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    saved = tmp_path / "plan"
    saved.mkdir()
    for host, plan in json.loads(done.stdout)["hosts"].items():
        (saved / f"{host}.json").write_text(json.dumps(plan))
    done = generate(SEED, tmp_path / "out", "--plans", str(saved))
    assert done.returncode == 0, done.stderr
    for name in FILES:
        assert (tmp_path / "out" / name).read_text() == (seed_out / name).read_text(), name


def test_a_missing_saved_plan_names_the_host_and_the_fix(tmp_path: Path) -> None:
    done = generate(SEED, tmp_path / "out", "--plans", str(tmp_path))
    assert done.returncode == 2
    assert f"--plans {tmp_path}: no plan for seed-4090" in done.stderr
    assert "run playbooks/preflight.yml" in done.stderr
    assert not (tmp_path / "out").exists()


def test_alert_durations_come_from_the_options(tmp_path: Path) -> None:
    done = generate(SEED, tmp_path / "out", "--down-for", "6s", "--alert-for", "1m")
    assert done.returncode == 0, done.stderr
    rules = yaml.safe_load((tmp_path / "out" / "rules" / "vllm-fleet.rules.yml").read_text())
    durations = {r["alert"]: r["for"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert durations["VllmInstanceDown"] == "6s"
    assert durations["VllmTTFTP99High"] == durations["VllmKVCacheNearFull"] == "1m"
    assert durations["NodeExporterDown"] == "5m"  # an exporter is not the instance: its own mark


def test_a_bad_alert_duration_is_refused_before_writing(tmp_path: Path) -> None:
    done = generate(SEED, tmp_path / "out", "--down-for", "2 minutes")
    assert done.returncode == 2
    assert "--down-for: '2 minutes' is no duration" in done.stderr
    assert not (tmp_path / "out").exists()


def test_every_alert_has_its_runbook_heading(seed_out: Path) -> None:
    rules = yaml.safe_load((seed_out / "rules" / "vllm-fleet.rules.yml").read_text())
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        assert f"\n## {rule['alert']}\n" in runbook, f"docs/runbook.md: no section for {rule['alert']}"
        assert rule["annotations"]["runbook"] == f"docs/runbook.md#{rule['alert'].lower()}"


def test_limits_from_verify_thresholds() -> None:
    assert limits_from(Thresholds()).ttft_p99_max_s == 2.0
    assert limits_from(Thresholds(ttft_p99_max_s=0.8, max_restarts=3)) == Limits(
        ttft_p99_max_s=0.8, max_restarts=3
    )
    assert (
        limits_from(Thresholds(spec_acceptance_min=None), spec_acceptance_min=0.4).spec_acceptance_min == 0.4
    )


# --- promtool test rules: every alert fires on synthetic series, then resolves ---------------------------


def _series(labels: dict[str, str], name: str, values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in {"__name__": name, **labels}.items())
    return {"series": "{" + inner + "}", "values": values}


Case = tuple[str, list[dict[str, str]], str, str, dict[str, str], str]


def alert_cases(target: dict[str, str]) -> list[Case]:
    """(alert, input series, fire time, resolved time, the firing alert's labels, its $value as rendered)."""
    vllm = {"job": "vllm", **target}
    scraped = {**vllm, "engine": "0", "model_name": target["model"]}
    key = {k: target[k] for k in ("fleet", "host", "instance")}
    host = {"fleet": target["fleet"], "host": target["host"]}
    node_series = {"job": "node", **host, "name": target["unit"]}

    def buckets(name: str, slow: str, fast: str) -> list[dict[str, str]]:
        # 20 min of observations in (1, 5] s, then 30 min in (0, 1] s: P99 about 4.96 s, then about 0.99 s
        return [
            _series({**scraped, "le": "1.0"}, name, f"0x20 0+{fast}x30"),
            _series({**scraped, "le": "5.0"}, name, f"0+{slow}x20 {20 * int(slow)}+{fast}x30"),
            _series({**scraped, "le": "+Inf"}, name, f"0+{slow}x20 {20 * int(slow)}+{fast}x30"),
        ]

    return [
        (
            "VllmInstanceDown",
            [_series(vllm, "up", "1 0 0 0 0 1x10")],
            "4m",
            "8m",
            {**vllm, "severity": "critical"},
            "",
        ),
        (
            "VllmInstanceRestarted",
            [_series(node_series, "node_systemd_service_restart_total", "0 0 1x80")],
            "10m",
            "75m",
            {**node_series, "instance": target["instance"], "severity": "warning"},
            "",
        ),
        (
            "VllmTTFTP99High",
            buckets("vllm:time_to_first_token_seconds_bucket", "10", "100"),
            "15m",
            "45m",
            {**key, "severity": "warning"},
            "4.96s",
        ),
        (
            "VllmRequestsQueueing",
            [_series(scraped, "vllm:num_requests_waiting", "30x20 0x10")],
            "15m",
            "25m",
            {**key, "severity": "warning"},
            "30",
        ),
        (
            "VllmPreempting",
            [_series(scraped, "vllm:num_preemptions_total", "0+5x20 100x20")],
            "15m",
            "35m",
            {**key, "severity": "warning"},
            "",
        ),
        (
            "VllmKVCacheNearFull",
            [_series(scraped, "vllm:kv_cache_usage_perc", "0.95x20 0.5x10")],
            "15m",
            "25m",
            {**key, "severity": "warning"},
            "95%",
        ),
        (
            "VllmPrefixHitRateLow",
            [
                _series(scraped, "vllm:prefix_cache_hits_total", "0+1x20 20+80x20"),
                _series(scraped, "vllm:prefix_cache_queries_total", "0+100x40"),
            ],
            "15m",
            "35m",
            {**key, "severity": "info"},
            "1%",
        ),
        (
            "VllmSpecAcceptanceLow",
            [
                _series(scraped, "vllm:spec_decode_num_accepted_tokens_total", "0+10x20 200+80x20"),
                _series(scraped, "vllm:spec_decode_num_draft_tokens_total", "0+100x40"),
            ],
            "15m",
            "35m",
            {**key, "severity": "warning"},
            "10%",
        ),
        (
            "VllmCPUOffloadAllocationFailing",
            [_series(scraped, "vllm:kv_offload_allocation_failure_total", "0 0 1 2 3 3x20")],
            "4m",
            "12m",
            {**scraped, "severity": "warning"},
            "",
        ),
        (
            "NodeExporterDown",
            [_series({"job": "node", **host}, "up", "0x10 1x5")],
            "7m",
            "12m",
            {"job": "node", **host, "severity": "warning"},
            "",
        ),
        (
            "GpuExporterDown",
            [_series({"job": "gpu", **host}, "up", "0x10 1x5")],
            "7m",
            "12m",
            {"job": "gpu", **host, "severity": "warning"},
            "",
        ),
    ]


def test_every_alert_fires_and_resolves_under_promtool(seed_out: Path, tmp_path: Path) -> None:
    config = yaml.safe_load((seed_out / "prometheus.yml").read_text())
    target = config["scrape_configs"][0]["static_configs"][0]["labels"]
    assert target["instance"] == "i0"
    rules = yaml.safe_load((seed_out / "rules" / "vllm-fleet.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    cases = alert_cases(target)
    assert {c[0] for c in cases} == alerts, "every alert the rules define has a case here"
    annotations = {
        r["alert"]: r["annotations"]
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r and r["labels"].get("instance") in (None, "i0")
    }
    tests = []
    for name, series, fire, resolve, labels, value in cases:
        # the annotations as Prometheus renders them: the plan's figures, the host, the value that fired
        expected = {
            key: re.sub(r"\{\{ \$value[^}]*\}\}", value, text).replace("{{ $labels.host }}", target["host"])
            for key, text in annotations[name].items()
        }
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": fire,
                        "alertname": name,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": expected}],
                    },
                    {"eval_time": resolve, "alertname": name, "exp_alerts": []},
                ],
            }
        )
    spec = tmp_path / "alerts.test.yml"
    spec.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(seed_out / "rules" / "vllm-fleet.rules.yml")],
                "evaluation_interval": "1m",
                "tests": tests,
            },
            sort_keys=False,
        )
    )
    done = subprocess.run(
        [promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_roles_argument_spec_names_every_default() -> None:
    role = ROOT / "roles" / "fleet_monitoring"
    defaults = set(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    assert set(specs["argument_specs"]["main"]["options"]) == defaults
