"""`vllm-fleet plan`: KV-cache capacity of one instance from the model's config.json (DESIGN §4).

Exit status: 0 with the plan (also when one request of max_model_len does not fit: that is an answer, shown as
`fits_on_gpu: false` and a warning); 2 when an input is unusable (message on stderr naming it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vllm_fleet.cli import emit
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import format_plan, plan_capacity
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.plan.inventory import plan_inventory
from vllm_fleet.plan.model import with_hf_overrides
from vllm_fleet.plan.model_config import parse_model_config, read_model_config_file
from vllm_fleet.plan.nodes import instances_over_hosts
from vllm_fleet.project import project_dir
from vllm_fleet.sizes import parse_human_int, parse_size


def load_model_config(path: str) -> dict[str, Any]:
    """The model's config.json; a JSON object embedded in other text (a pasted issue) is accepted too."""
    text = read_model_config_file(path, "--model-config")
    return parse_model_config(text, f"--model-config {path!r}", embedded=True)


def _partition(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise FleetInputError(
            f"--pp-layer-partition: {text!r} is not a comma-separated list of layer counts such as 16,32"
        ) from exc


def _overrides(text: str | None) -> dict[str, Any]:
    """`--hf-overrides JSON` as vLLM's flag takes it (vllm_service_hf_overrides)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FleetInputError(
            f"--hf-overrides: {text!r} is not JSON ({exc.msg}); give e.g. '{{\"sliding_window\": 512}}'"
        ) from exc
    if not isinstance(value, dict):
        raise FleetInputError(f"--hf-overrides: {text!r} must be a JSON object, as vLLM's flag takes it")
    return value


def _env(pairs: list[str] | None) -> dict[str, str]:
    """`--env NAME=VALUE` words as the service's environment (vllm_service_extra_env)."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        name, equals, value = pair.partition("=")
        if not equals or not name.strip():
            raise FleetInputError(
                f"--env: {pair!r} is not NAME=VALUE; give e.g. --env "
                "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1"
            )
        env[name.strip()] = value
    return env


def _handle_inventory(args: argparse.Namespace) -> int:
    """Every host's plan from the inventory: the HostPlan preflight would build, no host touched."""
    facts = Path(args.facts) if args.facts else None
    plans = plan_inventory(args.inventory, project_dir=project_dir(), limit=args.limit, probe_dir=facts)
    data: dict[str, Any] = {"hosts": {name: plan.to_dict() for name, plan in plans.items()}}
    spanning = instances_over_hosts(plans)
    if spanning:  # absent for inventories of single-host instances: their output is as it was
        data["instances_over_hosts"] = spanning
    human = "\n\n".join(
        [*(_host_summary(plan) for plan in plans.values()), *map(_spanning_summary, spanning)]
    )
    emit(data, args.json, human)
    return 0 if all(plan.ok for plan in plans.values()) else 1


def _spanning_summary(entry: dict[str, Any]) -> str:
    capacity = entry.get("capacity") or {}
    tokens = (
        f"{capacity['gpu_kv_tokens']:,} KV tokens"
        if capacity.get("gpu_kv_tokens")
        else "capacity not planned"
    )
    api = entry.get("api") or {}
    return (
        f"== one instance over {', '.join(entry['nodes'])}: TP{entry['tensor_parallel_size']} x "
        f"PP{entry['pipeline_parallel_size']}, layers per stage {entry['stage_layers'] or '?'}, master "
        f"{entry['master']}; {tokens} (the stage with the fewest blocks); API on rank 0 "
        f"({api.get('host', '?')}, port {api.get('port', '?')})"
    )


def _host_summary(plan: HostPlan) -> str:
    lines = [plan.report or f"== {plan.host} ({plan.source})"]
    for instance in plan.instances:
        capacity = instance.capacity or {}
        tokens = f", {capacity['gpu_kv_tokens']:,} KV tokens" if capacity.get("gpu_kv_tokens") else ""
        where = "headless rank (no API)" if instance.headless else instance.base_url
        lines.append(f"{instance.name}: {where}{tokens}\n  {instance.shell}")
    lines += [f"error: {e}" for e in plan.errors] + [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def _handle(args: argparse.Namespace) -> int:
    if args.inventory:
        return _handle_inventory(args)
    missing = [
        flag
        for flag, value in (
            ("--model-config", args.model_config),
            ("--max-model-len", args.max_model_len),
        )
        if value is None
    ]
    if missing:
        raise FleetInputError(
            f"one instance's capacity needs --model-config FILE and --max-model-len L (missing: "
            f"{', '.join(missing)}); or give --inventory PATH for every host's plan"
        )
    if args.kv_cache_memory_bytes is None and args.kv_bytes_per_gpu is None:
        raise FleetInputError(
            "give the KV memory per GPU: --kv-cache-memory-bytes B (as vLLM's flag) or --kv-bytes-per-gpu B "
            "(e.g. the 'Available KV cache memory' of a log, 10GiB)"
        )
    if args.kv_cache_memory_bytes is not None and args.kv_bytes_per_gpu is not None:
        raise FleetInputError("give only one of --kv-cache-memory-bytes and --kv-bytes-per-gpu")
    if args.kv_cache_memory_bytes is not None:
        kv_bytes = parse_size(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes")
    else:
        kv_bytes = parse_size(args.kv_bytes_per_gpu, "--kv-bytes-per-gpu")
    plan = plan_capacity(
        with_hf_overrides(load_model_config(args.model_config), _overrides(args.hf_overrides)),
        tensor_parallel_size=parse_human_int(args.tensor_parallel_size, "--tensor-parallel-size"),
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=parse_human_int(args.max_model_len, "--max-model-len"),
        kv_bytes_per_gpu=kv_bytes,
        block_size=parse_human_int(args.block_size, "--block-size") if args.block_size is not None else None,
        max_num_batched_tokens=(
            parse_human_int(args.max_num_batched_tokens, "--max-num-batched-tokens")
            if args.max_num_batched_tokens is not None
            else None
        ),
        avg_input_len=(
            parse_human_int(args.avg_input_len, "--avg-input-len") if args.avg_input_len is not None else None
        ),
        vllm_version=args.vllm_version,
        num_speculative_tokens=parse_human_int(args.num_speculative_tokens, "--num-speculative-tokens"),
        mamba_cache_mode=args.mamba_cache_mode,
        enable_prefix_caching=args.enable_prefix_caching,
        device=args.device,
        dtype=args.dtype,
        pipeline_parallel_size=parse_human_int(args.pipeline_parallel_size, "--pipeline-parallel-size"),
        decode_context_parallel_size=parse_human_int(
            args.decode_context_parallel_size, "--decode-context-parallel-size"
        ),
        pp_layer_partition=_partition(args.pp_layer_partition),
        env=_env(args.env),
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
    )
    emit(plan.to_dict(), args.json, format_plan(plan))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="KV-cache capacity of one instance, or every host's plan of an inventory",
        description=(
            "Compute KV bytes per token, the GPU KV tokens vLLM will report, the maximum concurrency at "
            "max_model_len, whether one request of max_model_len fits, the CPU tier it would need, prefill "
            "chunks and the concurrency at an average input length. Sizes accept 10737418240, 10GiB, 10G "
            "(binary, as vLLM reads them) and 10g / 10GB (decimal). All memory is per GPU. With --inventory: "
            "the plan preflight builds for every host (layout, argv, capacity, errors); --json prints "
            '{"hosts": {name: HostPlan}}; exit 1 when a host\'s plan has errors.'
        ),
    )
    parser.add_argument(
        "--inventory",
        "-i",
        metavar="PATH",
        help="every host's plan from this Ansible inventory (recorded or probed facts); no host is touched",
    )
    parser.add_argument("--limit", "-l", metavar="PATTERN", help="with --inventory: only these hosts")
    parser.add_argument(
        "--facts",
        metavar="DIR",
        help="with --inventory: the probe's saved facts, <DIR>/<host>.json (default reports/probe), "
        "for hosts without gpu_topology_recorded_dir",
    )
    parser.add_argument("--model-config", metavar="FILE", help="the model's config.json")
    parser.add_argument("--tensor-parallel-size", "-tp", default="1", metavar="N")
    parser.add_argument("--pipeline-parallel-size", "-pp", default="1", metavar="N")
    parser.add_argument(
        "--pp-layer-partition", metavar="LIST", help="layers per stage, as VLLM_PP_LAYER_PARTITION (16,32)"
    )
    parser.add_argument("--decode-context-parallel-size", "-dcp", default="1", metavar="N")
    memory = parser.add_argument_group("KV memory per GPU (one of)")
    memory.add_argument("--kv-cache-memory-bytes", metavar="B", help="as vLLM's --kv-cache-memory-bytes")
    memory.add_argument("--kv-bytes-per-gpu", metavar="B", help="e.g. a log's 'Available KV cache memory'")
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        metavar="D",
        help="auto (vLLM's default), fp8, fp8_e4m3, bfloat16, ...",
    )
    parser.add_argument("--max-model-len", metavar="L", help="tokens per request (32k = 32000)")
    parser.add_argument("--max-num-batched-tokens", metavar="T", help="prefill chunk size")
    parser.add_argument(
        "--avg-input-len", metavar="I", help="typical request length for a concurrency figure"
    )
    parser.add_argument(
        "--block-size", metavar="N", help="KV block size in tokens (default: vLLM's, 16 on GPU, 128 on CPU)"
    )
    parser.add_argument(
        "--vllm-version",
        metavar="V",
        help="the release vLLM runs (vllm_install_version); its formula, never a neighbour's (default: the "
        "newest catalogued)",
    )
    parser.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="a variable of the service's environment (vllm_service_extra_env) that steers vLLM's KV-cache "
        "manager, e.g. VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1; repeatable",
    )
    parser.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        default=None,
        help="as vLLM's flag (in vllm_service_extra_args): sliding-window and chunked-local layers sized "
        "as full attention",
    )
    parser.add_argument(
        "--num-speculative-tokens", default="0", metavar="K", help="MTP/draft tokens (hybrid models' state)"
    )
    parser.add_argument(
        "--mamba-cache-mode",
        choices=("align", "none", "all"),
        default=None,
        help="hybrid models: default vLLM's choice for the release ('none' before 0.28.0, 'align' from it)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="as vllm serve's flag; unset: vLLM's default (hybrid models: off before 0.28.0, on from it)",
    )
    parser.add_argument(
        "--device",
        default="GPU",
        type=str.upper,
        help="vLLM's backend, the word of its log line: GPU or CPU (CPU: 128-token blocks by default)",
    )
    parser.add_argument("--dtype", help="model dtype when not the config's (as vLLM's --dtype)")
    parser.add_argument(
        "--hf-overrides",
        metavar="JSON",
        help="as vLLM's flag (vllm_service_hf_overrides): keys that replace the config's, e.g. a window",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
