"""Every unit vllm_service writes passes `systemd-analyze verify` with no output at all, for real layouts.

Layouts come from real recorded hardware (tests/fixtures/topology/recorded/: a 2 x H200 capture, an
8 x RTX 4090 dual-socket server; the H200 host's lscpu alone for a host without GPUs); the serve commands are
rendered by
vllm_fleet.render.serve for real vLLM releases. systemd-analyze runs with --root on a scratch copy of
/lib/systemd/system (no booted systemd here); it checks that ExecStart's first word exists in that root, so
the scratch root gets empty executables at those paths. It exits 0 on warnings: any output fails the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.deploy.service import (
    MARKER_KEY,
    InstanceFiles,
    ServiceOptions,
    env_file_text,
    exec_start_lines,
    instance_files,
    markers_of,
    restart_list,
    stale_instances,
)
from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.probe.topology import build_topology_from_dir, build_topology_from_texts

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "topology" / "recorded"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None or not Path("/lib/systemd/system").is_dir(),
    reason="systemd-analyze and /lib/systemd/system are needed (apt-get install systemd)",
)

SEED_VARS: dict[str, Any] = {
    # The seed deployment (shared/seed), spelled as inventory variables.
    "vllm_service_model": "/data/vllm_models/Qwen3-VL-27B-W4A16-mtp",
    "vllm_service_served_model_name": "qwen3-27b",
    "vllm_service_max_model_len": 750000,
    "vllm_service_gpu_memory_utilization": 0.85,
    "vllm_service_kv_cache_dtype": "fp8_e4m3",
    "vllm_service_kv_cache_memory_bytes": "10GiB",
    "vllm_service_enable_prefix_caching": True,
    "vllm_service_enable_chunked_prefill": True,
    "vllm_service_max_num_batched_tokens": 8192,
    "vllm_service_max_num_seqs": 96,
    "vllm_service_kv_offload_cpu_bytes": "200GiB",
    "vllm_service_kv_offload_eviction_policy": "arc",
    "vllm_service_speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
    "vllm_service_limit_mm_per_prompt": {"image": 40},
    "vllm_service_compilation_config": {"cudagraph_mode": "PIECEWISE"},
    "vllm_service_api_key": "sk-test-not-a-real-key",
    "vllm_service_extra_args": ["--chat-template-content-format", "string"],
}


# Instances without an API key whose tests are not about exposure say so (no host set binds every interface).
OPEN = {"vllm_service_allow_unauthenticated": True}


def layouts() -> dict[str, tuple[Any, Any]]:
    cpu = build_topology_from_texts({"lscpu": (RECORDED / "h200x2" / "lscpu.txt").read_text()})
    return {
        "h200x2-tp2": (build_topology_from_dir(RECORDED / "h200x2"), None),
        "8x4090-2xtp4-numactl": (build_topology_from_dir(RECORDED / "8x4090-dual-socket"), 4),
        "8x4090-4xtp2-numactl": (build_topology_from_dir(RECORDED / "8x4090-dual-socket"), 2),
        "cpu-only": (cpu, None),
    }


def instance_plans(name: str, version: str = "0.32.0", **variables: Any) -> list[InstancePlan]:
    """The instances build_host_plan makes for one recorded layout (rules the seed's own model would judge
    are not these tests' concern: no config.json, capacity unchecked)."""
    topology, tp = layouts()[name]
    base = (
        SEED_VARS
        if topology.gpus
        else {**OPEN, "vllm_service_model": "/srv/m", "vllm_service_dtype": "bfloat16"}
    )
    plan = build_host_plan(
        "h",
        {**base, "vllm_service_tensor_parallel_size": tp, "vllm_service_capacity_check": False, **variables},
        topology,
        vllm_version=version,
    )
    return plan.instances


def scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "lib" / "systemd" / "system", symlinks=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    return root


def verify(root: Path, unit: InstanceFiles) -> str:
    for word in (unit.plan["argv"][0], "/usr/bin/python3"):
        exe = root / word.lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    path = root / "etc" / "systemd" / "system" / unit.unit_name
    path.write_text(unit.unit_text)
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", f"--root={root}", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return (proc.stdout + proc.stderr).strip() + ("" if proc.returncode == 0 else f"\n[rc={proc.returncode}]")


@pytest.mark.parametrize("version", ["0.32.0", "0.19.1"])
@pytest.mark.parametrize("name", list(layouts()))
def test_every_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path, name: str, version: str) -> None:
    root = scratch_root(tmp_path)
    extra_env = {"PCT": "100%", "DOLLAR": "$HOME", "QUOTE": 'say "hi"'}
    for inst in instance_plans(name, version, vllm_service_extra_env=extra_env):
        files = instance_files(
            inst,
            options=ServiceOptions(),
            secret_env={"VLLM_API_KEY": "sk-test-not-a-real-key"} if inst.secret_env_names else {},
        )
        assert verify(root, files) == "", files.unit_text
        assert files.unit_text.count("ExecStart=") == 1
        if inst.numa_binding["mode"] == "numactl":
            node = inst.numa_binding["nodes"][0]
            assert f"ExecStart=/usr/bin/numactl --cpunodebind={node} --membind={node} \\\n" in files.unit_text
        assert "LimitMEMLOCK=infinity" in files.unit_text
        assert f"{MARKER_KEY}={inst.name}" in files.unit_text


@pytest.mark.parametrize(
    ("version", "flag", "stop"), [("0.26.0", ["--shutdown-timeout", "600"], 660), ("0.14.0", [], 60)]
)
def test_the_drain_and_the_stop_wait_pass_systemd_analyze_verify(
    tmp_path: Path, version: str, flag: list[str], stop: int
) -> None:
    """--shutdown-timeout only where the release has it, TimeoutStopSec past it, SIGTERM to the API server
    alone for an instance that started (ExecStop, deploy.service.STOP_IN_ORDER: test_deploy_lab's restarts
    show why); both verify clean."""
    root = scratch_root(tmp_path)
    for inst in instance_plans("h200x2-tp2", version):
        files = instance_files(
            inst, options=ServiceOptions(), secret_env={"VLLM_API_KEY": "sk-test-not-a-real-key"}
        )
        assert verify(root, files) == "", files.unit_text
        argv = files.plan["argv"]
        assert (
            argv[argv.index("--shutdown-timeout") :][:2] == flag if flag else "--shutdown-timeout" not in argv
        )
        assert f"\nTimeoutStopSec={stop}\n" in files.unit_text
        assert "\nExecStop=" in files.unit_text and "KillMode=" not in files.unit_text
        assert "\nKillSignal=SIGKILL\n" in files.unit_text


def test_the_check_can_fail(tmp_path: Path) -> None:
    """A misspelt directive makes systemd-analyze print a warning (still exit 0): the check sees it."""
    (inst,) = instance_plans("cpu-only")
    files = instance_files(inst, options=ServiceOptions())
    files.unit_text = files.unit_text.replace("LimitMEMLOCK=infinity", "LimitMEMLOK=infinity")
    assert "Unknown key 'LimitMEMLOK' in section [Service]" in verify(scratch_root(tmp_path), files)


def test_environment_file_quotes_and_secrets_stay_out_of_the_plan() -> None:
    (inst,) = instance_plans("h200x2-tp2")
    secret = {"VLLM_API_KEY": "sk-test-not-a-real-key"}
    files = instance_files(inst, options=ServiceOptions(), secret_env=secret)
    assert 'VLLM_API_KEY="sk-test-not-a-real-key"' in files.env_text
    assert 'CUDA_VISIBLE_DEVICES="0,1"' in files.env_text
    assert 'CUDA_DEVICE_ORDER="PCI_BUS_ID"' in files.env_text
    assert "sk-test" not in files.plan_text and "sk-test" not in files.unit_text
    assert files.plan["secret_env_names"] == ["VLLM_API_KEY"]
    assert json.loads(files.plan_text)["argv"] == inst.argv
    assert InstancePlan.from_dict(json.loads(files.plan_text)).argv == inst.argv  # read back as written
    assert env_file_text({"A": 'x"y\\z'}).splitlines()[1] == 'A="x\\"y\\\\z"'
    with pytest.raises(Exception, match="not an environment variable name"):
        env_file_text({"1BAD": "x"})


def test_a_missing_secret_is_refused_before_anything_is_written() -> None:
    (inst,) = instance_plans("h200x2-tp2")
    with pytest.raises(Exception, match="expects the secret VLLM_API_KEY"):
        instance_files(inst, options=ServiceOptions())


def test_exec_start_puts_each_flag_on_its_own_line() -> None:
    text = exec_start_lines(
        [
            "/usr/bin/numactl",
            "--cpunodebind=1",
            "--membind=1",
            "/v/bin/vllm",
            "serve",
            "/m",
            "--port",
            "8001",
            "--hf-overrides",
            '{"rope_scaling":{"factor":3.0}}',
        ]
    )
    assert text.splitlines() == [
        "ExecStart=/usr/bin/numactl --cpunodebind=1 --membind=1 \\",
        "    /v/bin/vllm serve /m \\",
        "    --port 8001 \\",
        '    --hf-overrides "{\\"rope_scaling\\":{\\"factor\\":3.0}}"',
    ]


def _files(name: str, digest: str) -> InstanceFiles:
    return InstanceFiles(name, f"vllm-fleet-{name}.service", "", "", "", "", "", {}, "", digest, "", "")


def test_restart_only_what_changed_or_is_down() -> None:
    files = [_files("i0", "aaa"), _files("i1", "bbb"), _files("i2", "ccc"), _files("i3", "ddd")]
    applied = {"i0": "aaa\n", "i1": "old", "i2": "ccc"}
    active = {"i0": "active", "i1": "active", "i2": "failed", "i3": "inactive"}
    todo = {t["name"]: (t["action"], t["why"]) for t in restart_list(files, applied, active)}
    assert todo == {
        "i1": ("restarted", "its unit, environment or serve command changed"),
        "i2": ("started", "it is failed"),
        "i3": ("restarted", "new instance"),
    }
    assert restart_list([_files("i0", "aaa")], {"i0": "aaa"}, {"i0": "activating"}) == []


def test_stale_units_are_the_instances_no_longer_in_the_layout() -> None:
    units = {  # what the role's one read returns for its glob over the unit directory
        "/etc/systemd/system/vllm-fleet-i0.service": "[Unit]\nX-VllmFleet-Instance=i0\n",
        "/etc/systemd/system/vllm-fleet-i1.service": "[Unit]\nX-VllmFleet-Instance=i1\n",
        "/etc/systemd/system/vllm-fleet-tuning.service": "[Unit]\nDescription=not an instance\n",
    }
    markers = markers_of(units)
    assert markers == {
        "/etc/systemd/system/vllm-fleet-i0.service": "i0",
        "/etc/systemd/system/vllm-fleet-i1.service": "i1",
    }
    assert stale_instances(markers, ["i0"]) == ["i1"]
    assert stale_instances(markers, ["i0", "i1"]) == []
