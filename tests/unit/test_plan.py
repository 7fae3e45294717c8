"""vllm_fleet.plan: one plan per host, built by one function, read back by every stage.

Inventories are the project's own (inventory/examples/seed-4x4090, planned on the recorded 8 x RTX 4090 host
and the real Qwen3.6-27B config.json) or copies of it in a temporary folder with one variable changed; the
variables are read with ansible-core's own inventory machinery (vllm_fleet.plan.inventory)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml
from plans import TINY_CONFIG, cpu_topology, lab_host_plan

from vllm_fleet.cli import main as cli_main
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.build import build_host_plan, fleet_errors
from vllm_fleet.plan.host import HostPlan, InstancePlan
from vllm_fleet.plan.inventory import plan_inventory

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "inventory" / "examples" / "seed-4x4090"
GiB = 2**30


def _seed_copy(tmp_path: Path, **variables: object) -> Path:
    """The seed inventory beside its siblings (its facts point at ../8x4090-dual-socket and ../models), with
    `variables` added as one more group_vars file."""
    examples = tmp_path / "examples"
    shutil.copytree(ROOT / "inventory" / "examples", examples)
    if variables:
        (examples / "seed-4x4090" / "group_vars" / "all" / "zz-test.yml").write_text(
            yaml.safe_dump(variables)
        )
    return examples / "seed-4x4090"


def test_the_seed_inventory_plans_layout_argv_and_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", "--inventory", str(SEED), "--json"]) == 0
    host = json.loads(capsys.readouterr().out)["hosts"]["seed-4090"]
    assert host["ok"] and host["errors"] == [] and host["vllm_version"] == "0.33.0"
    # planned on a stand-in recording, and the first line says so (issue 32)
    assert host["source"].startswith("STAND-IN, not this host's hardware: a real 8 x RTX 4090 dual-socket")
    assert host["source"].endswith(f"; recorded: {SEED}/recorded")
    assert host["report"].splitlines()[0] == f"== seed-4090 ({host['source']})"
    assert host["model_config_source"].endswith("qwen3.6-27b.config.json")
    i0, i1 = host["instances"]
    assert (i0["gpus"], i1["gpus"]) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert (i0["numa_binding"], i1["numa_binding"]) == (
        {"mode": "numactl", "nodes": [0]},
        {"mode": "numactl", "nodes": [1]},
    )
    assert i0["argv"][:3] == ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0"]
    assert i0["argv"][3] == "/opt/vllm-fleet/venv/bin/vllm"  # the role default, templated as the role sees it
    assert "--kv-cache-memory-bytes" in i0["argv"] and "--disable-custom-all-reduce" in i0["argv"]
    assert (i0["port"], i1["port"]) == (8000, 8001) and i1["argv"][-2:] == ["--port", "8001"]
    # The planner's figure for Qwen3.6-27B on 4 x 10 GiB, fp8 KV (the README's 1,269,111 tokens).
    assert i0["capacity"]["gpu_kv_tokens"] == 1_269_111 and i0["expectations"]["kv_cache_tokens"] == 1_269_111
    assert host["needs"]["cpu_kv_bytes"] == 2 * 200 * GiB and host["needs"]["shm_bytes"] == 2 * 200 * GiB
    assert host["needs"]["bound_numa_nodes"] == [0, 1]
    assert i0["unit"] == "vllm-fleet-i0.service" and i0["base_url"] == "http://127.0.0.1:8000"


def test_a_plan_reads_back_as_it_was_written() -> None:
    (plan,) = plan_inventory(str(SEED), project_dir=ROOT).values()
    data = plan.to_dict()
    assert HostPlan.from_dict(json.loads(json.dumps(data))).to_dict() == data
    first = data["instances"][0]
    assert InstancePlan.from_dict(first).to_dict() == first


def test_without_the_models_config_every_capacity_setting_is_an_error(tmp_path: Path) -> None:
    inventory = _seed_copy(tmp_path, vllm_service_model_config="")
    (plan,) = plan_inventory(str(inventory), project_dir=ROOT).values()
    named = sorted(e.split(":")[0] for e in plan.errors if "config.json is not known" in e)
    assert named == [
        "vllm_service_kv_cache_memory_bytes",
        "vllm_service_kv_offload_cpu_bytes",
        "vllm_service_max_model_len",
        "vllm_service_max_num_seqs",
    ]
    assert all("vllm_service_capacity_check: false" in e for e in plan.errors if "config.json" in e)
    unchecked = _seed_copy(tmp_path / "b", vllm_service_model_config="", vllm_service_capacity_check=False)
    (plan,) = plan_inventory(str(unchecked), project_dir=ROOT).values()
    assert plan.ok, plan.errors


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("gpu_topology_base_port", "eighty", "gpu_topology: argument 'gpu_topology_base_port' is of type"),
        (
            "nvidia_driver_mode",
            "upgrade",
            "nvidia_driver: value of nvidia_driver_mode must be one of: detect",
        ),
        ("cuda_toolkit_enabled", "perhaps", "cuda_toolkit: argument 'cuda_toolkit_enabled' is of type"),
        ("vllm_install_pip_timeout", "long", "vllm_install: argument 'vllm_install_pip_timeout' is of type"),
        ("host_tuning_thp_enabled", "sometimes", "host_tuning: value of host_tuning_thp_enabled must be one"),
        ("vllm_service_start_timeout", "soon", "vllm_service: argument 'vllm_service_start_timeout' is of"),
        ("vllm_service_manage_state", "maybe", "vllm_service: argument 'vllm_service_manage_state' is of"),
        ("vllm_verify_ready_timeout", "later", "vllm_verify: argument 'vllm_verify_ready_timeout' is of"),
        ("vllm_rollout_max_fail_percentage", "some", "vllm_rollout: argument 'vllm_rollout_max_fail_perc"),
    ],
)
def test_every_roles_argument_spec_is_checked_at_plan_time(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    """What preflight's vllm_fleet_plan task reports before any host changes (a lab test runs it for real)."""
    (plan,) = plan_inventory(str(_seed_copy(tmp_path, **{variable: value})), project_dir=ROOT).values()
    matching = [e for e in plan.errors if e.startswith(message)]
    assert matching and all(value in e and "/meta/argument_specs.yml" in e for e in matching), plan.errors


def test_a_lookup_in_the_inventory_resolves_in_a_fresh_cli_process(tmp_path: Path) -> None:
    """The lab inventory derives its API key with lookup('ansible.builtin.file', ...): ansible-core finds its
    builtin plugins only once its collection loader is installed (CI caught `vllm-fleet plan` without it)."""
    import subprocess
    import sys

    key_file = tmp_path / "key.txt"
    key_file.write_text("from-a-file-not-a-secret\n")
    lookup = f"lookup('ansible.builtin.file', '{key_file}')"
    inventory = _seed_copy(tmp_path, vllm_service_api_key=f"{{{{ {lookup} | hash('sha256') }}}}")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("vllm-fleet")), "plan", "--inventory", str(inventory), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hosts"]["seed-4090"]["ok"]
    assert "from-a-file-not-a-secret" not in done.stdout + done.stderr


def test_an_undefined_variable_is_an_input_error_naming_host_and_variable() -> None:
    # the 4 x 4090 example leaves its API key to a vault file: a message, not ansible-core's traceback
    inventory = ROOT / "inventory" / "examples" / "4x4090-single-socket"
    with pytest.raises(FleetInputError) as raised:
        plan_inventory(str(inventory), project_dir=ROOT)
    message = str(raised.value)
    assert message.startswith(f"--inventory {inventory}: host rtx4090-4x: vllm_service_api_key: ")
    assert "'vault_vllm_service_api_key' is undefined" in message


def test_vllm_service_port_is_the_first_instance_port() -> None:
    """Two instances never share a port: vllm_service_port 9000 gives 9000 and 9001 (it gave both 9000)."""
    (plan,) = plan_inventory(str(SEED), project_dir=ROOT).values()
    topology_source = plan.source.split("; recorded: ")[-1]
    plan = build_host_plan(
        "h",
        {
            "vllm_service_model": "/m",
            "vllm_service_host": "127.0.0.1",
            "vllm_service_port": 9000,
            "gpu_topology_recorded_dir": topology_source,
        },
        _recorded(topology_source),
        vllm_version="0.33.0",
        model_config=json.loads((ROOT / "inventory/examples/models/qwen3.6-27b.config.json").read_text()),
    )
    assert [i.port for i in plan.instances] == [9000, 9001]
    assert [i.argv[-1] for i in plan.instances] == ["9000", "9001"]


def _recorded(path: str):
    from vllm_fleet.probe.topology import build_topology_from_dir

    return build_topology_from_dir(path)


def test_fleet_checks_refuse_shared_ports_names_and_missing_gpus() -> None:
    plan = lab_host_plan()
    (only,) = plan.instances
    twin = dataclasses.replace(only, gpus=[3])
    errors = fleet_errors([only, twin], cpu_topology())
    assert errors == [
        "vllm_service_port: instances i0 and i0 would both listen on 8000; "
        "the layout gives each instance the next port after vllm_service_port: "
        "leave --port out of vllm_service_extra_args",
        "i0: GPUs [3] do not exist on this host (0 GPUs); re-run the probe",
        "i0: two instances of one host share the name; re-run the probe",
    ]


def test_max_model_len_beyond_the_models_positions_is_refused() -> None:
    """The tiny lab model has 2,048 positions (its config.json); vLLM refuses a longer max_model_len."""
    plan = build_host_plan(
        "lab-1",
        {
            "vllm_service_model": "/srv/vllm-fleet-lab/models/tiny",
            "vllm_service_host": "127.0.0.1",
            "vllm_service_max_model_len": 4096,
        },
        cpu_topology(),
        vllm_version="0.32.0",
        model_config=TINY_CONFIG,
    )
    assert plan.errors == [
        "i0: vllm_service_max_model_len: 4,096 is beyond the 2,048 positions "
        "the model's config.json supports (max_position_embeddings); "
        "vLLM refuses to start (User-specified max_model_len is greater than the derived max_model_len): "
        "lower it to 2,048 or less, or set vllm_service_rope_scaling "
        "(YaRN, factor x original_max_position_embeddings >= max_model_len)"
    ]
