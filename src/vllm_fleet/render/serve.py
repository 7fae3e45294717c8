"""Render one layout instance's `vllm serve` command for a given vLLM release.

    render_instance(spec, instance, vllm_version, *, model_config=None, topology=None) -> Rendered

The argv is spelled for the target release (vllm-facts §1): `--kv-cache-memory-bytes` (never the argparse
prefix `--kv-cache-memory`), `--rope-scaling` up to 0.11.0 and `--hf-overrides` after it, `mtp` for the
deprecated `*_mtp` speculative methods, `--numa-bind --numa-bind-nodes` when the layout gives the binding to
vLLM (>= 0.20), a process-wide `numactl` wrapper when the layout binds the instance to one node. JSON values
are compact. `exec_start` is quoted for a systemd `ExecStart=` line, `shell` for a POSIX shell.

Errors and warnings of the validator (`vllm_fleet.render.validate`) come back with it; the argv is still
returned
when there are errors, so a user sees what would have run.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_fleet import flags as flagcat
from vllm_fleet.errors import FleetInputError
from vllm_fleet.hostvalues import exec_word
from vllm_fleet.render import validate as validation
from vllm_fleet.render.schema import ServeSpec

if TYPE_CHECKING:
    from vllm_fleet.plan.nodes import NodePlan


@dataclass
class Rendered:
    name: str
    argv: list[str]
    exec_start: str
    shell: str
    env: dict[str, str]
    secret_env_names: list[str]
    port: int | None
    vllm_version: str
    catalog_release: str
    expectations: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------- quoting


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def systemd_quote_word(word: str) -> str:
    """One argv word for an ExecStart= line: vllm_fleet.hostvalues quotes every line the roles write."""
    return exec_word(word)


def systemd_quote(argv: list[str]) -> str:
    if not argv or not argv[0].startswith("/"):
        raise FleetInputError(
            f"ExecStart: the first word must be an absolute path, got {argv[:1]!r}; "
            "set vllm_service_venv to the venv's absolute path"
        )
    return " ".join(systemd_quote_word(word) for word in argv)


def shell_quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in argv)


# ---------------------------------------------------------------------------------- layout instances


def _get(instance: Any, key: str, default: Any = None) -> Any:
    """Layout instances arrive as `layout.Instance` objects or as their JSON (the `gpu_topology` fact)."""
    if isinstance(instance, dict):
        return instance.get(key, default)
    return getattr(instance, key, default)


def instance_view(instance: Any) -> dict[str, Any]:
    binding = _get(instance, "numa_binding") or {}
    if not isinstance(binding, dict):
        binding = {"mode": getattr(binding, "mode", "none"), "nodes": list(getattr(binding, "nodes", []))}
    gpus = list(_get(instance, "gpus") or [])
    return {
        "name": str(_get(instance, "name") or "i0"),
        "gpus": gpus,
        "tensor_parallel_size": _get(instance, "tensor_parallel_size") or max(1, len(gpus)),
        "port": _get(instance, "port"),
        "cuda_visible_devices": _get(instance, "cuda_visible_devices"),
        "numa_mode": str(binding.get("mode") or "none"),
        "numa_nodes": [int(n) for n in binding.get("nodes") or []],
        "membind_nodes": [int(n) for n in binding.get("membind_nodes") or []],
        "numa_node": _get(instance, "numa_node"),
        "disable_custom_all_reduce": bool(_get(instance, "disable_custom_all_reduce", False)),
        "env": {str(k): str(v) for k, v in (_get(instance, "env") or {}).items()},
        "device": _get(instance, "device") or ("cpu" if not gpus else "gpu"),
    }


# ------------------------------------------------------------------------------------------- renderer


class _Argv:
    """argv under construction; every flag goes through the catalog of the target release."""

    def __init__(self, release: flagcat.Release) -> None:
        self.release = release
        self.words: list[str] = []
        self.errors: list[str] = []

    def add(self, option: str, *values: Any, variable: str) -> None:
        if not self.release.has(option):
            self.errors.append(
                f"{variable}: {option} does not exist in vLLM {self.release.version} "
                f"({option} is {flagcat.describe_availability(option)}); upgrade vLLM or unset {variable}"
            )
            return
        self.words.append(option)
        self.words.extend(str(v) for v in values)

    def flag_bool(self, positive: str, value: bool | None, variable: str) -> None:
        if value is None:
            return
        if value:
            self.add(positive, variable=variable)
            return
        negative = "--no-" + positive[2:]
        self.add(negative, variable=variable)


def render_instance(
    spec: ServeSpec,
    instance: Any,
    vllm_version: str,
    *,
    model_config: dict[str, Any] | None = None,
    topology: dict[str, Any] | None = None,
    node: NodePlan | None = None,
) -> Rendered:
    """The argv, ExecStart line, environment and checks of one instance for `vllm_version`, the release
    vllm_install_version installs: flags and capacity are that release's, and a release the flag catalog does
    not hold raises FleetInputError with the fix (a neighbour's KV-cache formula expected 77,947 tokens where
    vLLM 0.26.0 printed 50,045, issue 34). `node`: this host's rank of an instance over several hosts."""
    release = flagcat.release(vllm_version)
    view = instance_view(instance)
    view["node"] = node
    warnings: list[str] = []
    errors: list[str] = []
    argv = _Argv(release)
    argv.words += [f"{spec.venv.rstrip('/')}/bin/vllm", "serve", spec.model]
    wrapper = _numa_wrapper(spec, view, release, argv)
    _serve_flags(spec, view, release, argv, model_config or {}, warnings)
    # the rendered words are checked too: values (dtypes, methods, parsers, JSON keys) come from variables
    for words, label in (
        (argv.words[3:], validation.RENDERED),
        (list(spec.extra_args), "vllm_service_extra_args"),
    ):
        check_errors, check_warnings = validation.check_args(words, release, label)
        errors += check_errors
        warnings += check_warnings
    words = wrapper + argv.words + list(spec.extra_args)
    errors = argv.errors + errors
    env = dict(view["env"])
    if view["cuda_visible_devices"] not in (None, ""):
        env["CUDA_VISIBLE_DEVICES"] = str(view["cuda_visible_devices"])
    env.update(node_env(node))
    secret_env_names = ["VLLM_API_KEY"] if spec.api_key else []
    # vllm_service_port is the layout's base port: instance k listens on base + k (plan_layout)
    port = view["port"]
    v_errors, v_warnings, expectations = validation.validate_instance(
        spec, view, release, model_config=model_config or {}, topology=topology or {}
    )
    errors += v_errors
    warnings += v_warnings
    try:
        exec_start = systemd_quote(words)
    except FleetInputError as exc:
        errors.append(str(exc))
        exec_start = ""
    return Rendered(
        name=view["name"],
        argv=words,
        exec_start=exec_start,
        shell=shell_quote(words),
        env=env,
        secret_env_names=secret_env_names,
        port=port,
        vllm_version=flagcat.public_version(vllm_version),
        catalog_release=release.version,
        expectations=expectations,
        warnings=_unique(warnings),
        errors=_unique(errors),
    )


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _numa_wrapper(spec: ServeSpec, view: dict[str, Any], release: flagcat.Release, argv: _Argv) -> list[str]:
    """`numactl --cpunodebind=N --membind=N` for mode numactl; vLLM's own binding flags for mode vllm."""
    mode, nodes = view["numa_mode"], view["numa_nodes"]
    if mode == "numactl":
        if not nodes:
            argv.errors.append(
                f"layout instance {view['name']}: numa_binding mode numactl without nodes; re-run the probe "
                "so gpu_topology.layout names the NUMA node"
            )
            return []
        node_list = ",".join(str(n) for n in sorted(set(nodes)))
        # a node without memory of its own (CPU-only NUMA node) gets its memory from the nearest one
        mem_list = ",".join(str(n) for n in sorted(set(view["membind_nodes"] or nodes)))
        return [spec.numactl_path, f"--cpunodebind={node_list}", f"--membind={mem_list}"]
    if mode == "vllm":
        if not release.has("--numa-bind"):
            argv.errors.append(
                f"layout instance {view['name']}: numa_binding mode vllm needs vLLM >= 0.20 (--numa-bind is "
                f"{flagcat.describe_availability('--numa-bind')}); target {release.version} instead: "
                "upgrade, "
                "or plan instances that each sit on one NUMA node (numactl binding, e.g. 2 x TP2)"
            )
            return []
        per_gpu = nodes if len(nodes) == len(view["gpus"]) else []
        argv.add("--numa-bind", variable="gpu_topology.layout numa_binding")
        if per_gpu:
            argv.add("--numa-bind-nodes", *per_gpu, variable="gpu_topology.layout numa_binding.nodes")
        return []
    return []


def _serve_flags(
    spec: ServeSpec,
    view: dict[str, Any],
    release: flagcat.Release,
    argv: _Argv,
    model_config: dict[str, Any],
    warnings: list[str],
) -> None:
    v = "vllm_service_"
    if spec.served_model_name:
        argv.add("--served-model-name", *spec.served_model_name, variable=v + "served_model_name")
    tp = spec.tensor_parallel_size or view["tensor_parallel_size"]
    node = view["node"]
    # a rank of a multi-host instance holds k pipeline stages of TP GPUs each (plan.nodes)
    local_tp = len(view["gpus"]) // (len(node.stages) if node else 1)
    if spec.tensor_parallel_size and view["gpus"] and spec.tensor_parallel_size != local_tp:
        argv.errors.append(
            f"vllm_service_tensor_parallel_size: {spec.tensor_parallel_size} but layout instance "
            f"{view['name']} "
            f"has {len(view['gpus'])} GPUs ({view['gpus']}); unset it to take the layout's, or change the "
            "layout"
        )
    if view["device"] != "cpu" or tp > 1:
        argv.add("--tensor-parallel-size", tp, variable=v + "tensor_parallel_size")
    _node_flags(node, argv)
    if spec.max_model_len is not None:
        argv.add("--max-model-len", spec.max_model_len, variable=v + "max_model_len")
    if spec.dtype:
        argv.add("--dtype", spec.dtype, variable=v + "dtype")
    if spec.gpu_memory_utilization is not None:
        argv.add(
            "--gpu-memory-utilization",
            _num(spec.gpu_memory_utilization),
            variable=v + "gpu_memory_utilization",
        )
    if spec.kv_cache_dtype:
        argv.add("--kv-cache-dtype", spec.kv_cache_dtype, variable=v + "kv_cache_dtype")
    if spec.kv_cache_memory_bytes is not None:
        argv.add("--kv-cache-memory-bytes", spec.kv_cache_memory_bytes, variable=v + "kv_cache_memory_bytes")
    argv.flag_bool("--enable-prefix-caching", spec.enable_prefix_caching, v + "enable_prefix_caching")
    argv.flag_bool("--enable-chunked-prefill", spec.enable_chunked_prefill, v + "enable_chunked_prefill")
    if spec.max_num_batched_tokens is not None:
        argv.add(
            "--max-num-batched-tokens", spec.max_num_batched_tokens, variable=v + "max_num_batched_tokens"
        )
    if spec.max_num_seqs is not None:
        argv.add("--max-num-seqs", spec.max_num_seqs, variable=v + "max_num_seqs")
    argv.flag_bool(
        "--scheduler-reserve-full-isl", spec.scheduler_reserve_full_isl, v + "scheduler_reserve_full_isl"
    )
    kv_transfer = kv_transfer_config(spec, release, argv.errors)
    if kv_transfer:
        argv.add("--kv-transfer-config", compact_json(kv_transfer), variable=v + "kv_offload_cpu_bytes")
    if spec.speculative_config:
        argv.add(
            "--speculative-config",
            compact_json(speculative_config(spec, release, warnings)),
            variable=v + "speculative_config",
        )
    _rope_and_overrides(spec, release, argv, model_config, warnings)
    if spec.limit_mm_per_prompt:
        argv.add(
            "--limit-mm-per-prompt",
            compact_json(spec.limit_mm_per_prompt),
            variable=v + "limit_mm_per_prompt",
        )
    if spec.mm_processor_kwargs:
        argv.add(
            "--mm-processor-kwargs",
            compact_json(spec.mm_processor_kwargs),
            variable=v + "mm_processor_kwargs",
        )
    if spec.mm_ipc_gpu_memory_gb is not None:
        argv.add(
            "--mm-ipc-gpu-memory-gb", _num(spec.mm_ipc_gpu_memory_gb), variable=v + "mm_ipc_gpu_memory_gb"
        )
    if spec.compilation_config:
        argv.add(
            "--compilation-config", compact_json(spec.compilation_config), variable=v + "compilation_config"
        )
    if spec.enforce_eager:
        argv.add("--enforce-eager", variable=v + "enforce_eager")
    disable_car = spec.disable_custom_all_reduce
    if disable_car is None:
        disable_car = view["disable_custom_all_reduce"]
    if disable_car and tp > 1:
        argv.add("--disable-custom-all-reduce", variable=v + "disable_custom_all_reduce")
    if spec.reasoning_parser:
        argv.add("--reasoning-parser", spec.reasoning_parser, variable=v + "reasoning_parser")
    if spec.tool_call_parser:
        argv.add("--tool-call-parser", spec.tool_call_parser, variable=v + "tool_call_parser")
    if spec.enable_auto_tool_choice:
        argv.add("--enable-auto-tool-choice", variable=v + "enable_auto_tool_choice")
    if spec.enable_prompt_tokens_details:
        argv.add("--enable-prompt-tokens-details", variable=v + "enable_prompt_tokens_details")
    # A release without the flag aborts every request in flight on SIGTERM whatever is set: the gateway's
    # drain is then the only protection, and the unit keeps systemd's shorter stop wait (deploy.service).
    if spec.shutdown_timeout and release.has("--shutdown-timeout"):
        argv.add("--shutdown-timeout", spec.shutdown_timeout, variable=v + "shutdown_timeout")
    if node is not None and node.headless:
        return  # no API on ranks > 0: nothing listens for clients there
    if spec.host:
        argv.add("--host", spec.host, variable=v + "host")
    if view["port"]:
        argv.add("--port", view["port"], variable=v + "port")


def _node_flags(node: NodePlan | None, argv: _Argv) -> None:
    """vLLM's multi-host flags (`vllm/engine/arg_utils.py`, 0.11.1+), the same on every rank but the rank;
    ranks > 0 run `--headless`: their workers only, no API server and no engine core."""
    if node is None:
        return
    if node.pipeline_parallel_size > 1:
        argv.add(
            "--pipeline-parallel-size",
            node.pipeline_parallel_size,
            variable="vllm_service_pipeline_parallel_size",
        )
    argv.add("--nnodes", node.nnodes, variable="vllm_service_nodes")
    argv.add("--node-rank", node.rank, variable="vllm_service_nodes")
    argv.add("--master-addr", node.master_address, variable="vllm_service_nodes")
    argv.add("--master-port", node.master_port, variable="vllm_service_master_port")
    if node.headless:
        argv.add("--headless", variable="vllm_service_nodes")


def node_env(node: NodePlan | None) -> dict[str, str]:
    """The environment a rank needs: VLLM_HOST_IP, the address vLLM advertises to the other ranks (without
    it vLLM guesses from the default route), the interface that carries it for Gloo and NCCL, and
    VLLM_PP_LAYER_PARTITION where the split is set (vLLM reads
    it in `vllm/distributed/utils.py get_pp_indices`; no release has a flag for it)."""
    if node is None:
        return {}
    env = {"VLLM_HOST_IP": node.address}
    if node.interface:
        # torch.distributed's Gloo (the CPU build, and every build's CPU group) and NCCL pick an interface
        # themselves otherwise, which need not be the one the other ranks reach
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = node.interface
    if node.pp_layer_partition:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(str(n) for n in node.pp_layer_partition)
    return env


def _num(value: float) -> str:
    return f"{value:g}"


def kv_transfer_config(spec: ServeSpec, release: flagcat.Release, errors: list[str]) -> dict[str, Any]:
    """The OffloadingConnector configuration, with each key where the target release reads it."""
    if spec.kv_offload_cpu_bytes is None:
        if spec.kv_offload_extra_config:
            errors.append(
                "vllm_service_kv_offload_extra_config: set, but vllm_service_kv_offload_cpu_bytes is not; "
                "give the CPU tier's size (bytes across all workers)"
            )
        return {}
    offload = release.offloading
    if not offload.get("connector"):
        errors.append(
            f"vllm_service_kv_offload_cpu_bytes: the OffloadingConnector does not exist in vLLM "
            f"{release.version} (it came in 0.11.0); upgrade vLLM or unset the vllm_service_kv_offload_* "
            "variables"
        )
        return {}
    keys = set(offload.get("extra_config_keys", []))
    extra: dict[str, Any] = {}
    if "cpu_bytes_to_use" in keys:
        extra["cpu_bytes_to_use"] = spec.kv_offload_cpu_bytes
    else:
        errors.append(
            f"vllm_service_kv_offload_cpu_bytes: vLLM {release.version} sizes the CPU tier in blocks "
            "(num_cpu_blocks, before 0.14.0), not bytes; upgrade vLLM, or give "
            "vllm_service_kv_offload_extra_config: {num_cpu_blocks: N} and unset "
            "vllm_service_kv_offload_cpu_bytes"
        )
    if spec.kv_offload_eviction_policy is not None:
        policies = release.value_set("offloading_eviction_policy")
        if "eviction_policy" not in keys:
            errors.append(
                f"vllm_service_kv_offload_eviction_policy: vLLM {release.version}'s OffloadingConnector "
                "has no "
                "eviction_policy (it reads it since 0.11.1); unset it or upgrade vLLM"
            )
        elif policies and spec.kv_offload_eviction_policy not in policies:
            errors.append(
                f"vllm_service_kv_offload_eviction_policy: {spec.kv_offload_eviction_policy!r} is not a "
                "policy of "
                f"vLLM {release.version}; choose one of {', '.join(policies)}"
            )
        extra["eviction_policy"] = spec.kv_offload_eviction_policy
    if spec.kv_offload_prompt_only is not None:
        if "offload_prompt_only" not in keys:
            errors.append(
                f"vllm_service_kv_offload_prompt_only: vLLM {release.version} has no offload_prompt_only "
                "(since 0.23.0: default true); unset it or upgrade vLLM"
            )
        extra["offload_prompt_only"] = spec.kv_offload_prompt_only
    if spec.kv_offload_fs_tier is not None:
        if "secondary_tiers" not in keys or not offload.get("fs_tier_args"):
            errors.append(
                f"vllm_service_kv_offload_fs_tier: vLLM {release.version} has no fs secondary tier "
                "(TieringOffloadingSpec, 0.25.0+ in the catalog); unset it or upgrade vLLM"
            )
        tier = spec.kv_offload_fs_tier.to_tier()
        unknown = [k for k in tier if k != "type" and k not in offload.get("fs_tier_args", [])]
        if unknown and offload.get("fs_tier_args"):
            errors.append(
                f"vllm_service_kv_offload_fs_tier: {', '.join(unknown)} not arguments of vLLM "
                f"{release.version}'s fs "
                f"tier; it takes {', '.join(offload['fs_tier_args'])}"
            )
        extra["spec_name"] = "TieringOffloadingSpec"
        extra["secondary_tiers"] = [tier]
    for key, value in spec.kv_offload_extra_config.items():
        if keys and key not in keys:
            errors.append(
                f"vllm_service_kv_offload_extra_config: {key!r} is not read by vLLM {release.version}'s "
                f"OffloadingConnector; it reads {', '.join(sorted(keys))}"
            )
        extra[key] = value
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


def speculative_config(spec: ServeSpec, release: flagcat.Release, warnings: list[str]) -> dict[str, Any]:
    """The speculative config with the method spelled as the release wants it (`*_mtp` -> `mtp`)."""
    config = dict(spec.speculative_config)
    method = config.get("method")
    methods = release.value_set("speculative_method")
    if isinstance(method, str) and method != "mtp" and method.endswith("_mtp") and "mtp" in methods:
        warnings.append(
            f"vllm_service_speculative_config.method: {method!r} is deprecated since vLLM 0.11.0 and "
            "rewritten "
            f"to 'mtp' (vLLM logs a warning); rendered as 'mtp' for {release.version}"
        )
        config["method"] = "mtp"
    return config


def _rope_and_overrides(
    spec: ServeSpec,
    release: flagcat.Release,
    argv: _Argv,
    model_config: dict[str, Any],
    warnings: list[str],
) -> None:
    """`--rope-scaling` while it exists (<= 0.11.0); after that the scaling goes through `--hf-overrides`."""
    overrides = dict(spec.hf_overrides)
    if spec.rope_scaling:
        if release.has("--rope-scaling"):
            argv.add("--rope-scaling", compact_json(spec.rope_scaling), variable="vllm_service_rope_scaling")
        else:
            key, value = rope_override(spec.rope_scaling, release, model_config, warnings)
            target = overrides
            if model_config.get("text_config") and _rope_lives_in_text_config(model_config):
                target = overrides.setdefault("text_config", {})
            if key in target:
                argv.errors.append(
                    f"vllm_service_hf_overrides: sets {key} and vllm_service_rope_scaling is set too; keep "
                    "one"
                )
            target[key] = value
    if overrides:
        argv.add("--hf-overrides", compact_json(overrides), variable="vllm_service_hf_overrides")


def _rope_lives_in_text_config(model_config: dict[str, Any]) -> bool:
    text = model_config.get("text_config") or {}
    return any(k in text for k in ("rope_scaling", "rope_parameters", "rope_theta")) and not any(
        k in model_config for k in ("rope_scaling", "rope_parameters", "rope_theta")
    )


def rope_override(
    scaling: dict[str, Any],
    release: flagcat.Release,
    model_config: dict[str, Any],
    warnings: list[str],
) -> tuple[str, dict[str, Any]]:
    """(config key, value) of the hf override that carries RoPE scaling for the release.

    0.11.x reads `rope_scaling`; 0.12+ reads `rope_parameters`, and an override REPLACES that dict (vLLM's
    `_apply_dict_overrides` sets dict-valued attributes directly), so rope_theta from the model's config must
    be carried along or the model loses it."""
    if not flagcat.supports(release.version, "rope_parameters"):
        return "rope_scaling", dict(scaling)
    source = model_config
    if _rope_lives_in_text_config(model_config):
        source = model_config["text_config"]
    base: dict[str, Any] = {}
    if isinstance(source.get("rope_parameters"), dict):
        base = dict(source["rope_parameters"])
    elif source.get("rope_theta") is not None:
        base = {"rope_theta": source["rope_theta"]}
    if "rope_theta" not in base and "rope_theta" not in scaling:
        warnings.append(
            "vllm_service_rope_scaling: rendered as --hf-overrides rope_parameters, which replaces the "
            "model's "
            "whole rope_parameters; the model's config.json was not available, so rope_theta is not carried "
            "over: add rope_theta to vllm_service_rope_scaling (see the model's config.json)"
        )
    base.update(scaling)
    if "type" in base and "rope_type" not in base:
        base["rope_type"] = base.pop("type")
    return "rope_parameters", base
