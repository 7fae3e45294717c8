"""`vllm-fleet topology`: parse a host's topology outputs and print the probe report or its JSON."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vllm_fleet.cli import emit, read_input_file
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.layout import Layout, format_probe_report, plan_layout
from vllm_fleet.plan.model_config import parse_model_config, read_model_config_file
from vllm_fleet.probe.topology import RECORDED_FILES, build_topology_from_texts, read_recorded_dir
from vllm_fleet.terminal import terminal_safe

# flag destination -> build_topology keyword (and the key in RECORDED_FILES)
_INPUTS = {
    "topo_m": ("topo_m", "--topo-m"),
    "p2p": ("p2p_read", "--p2p"),
    "p2p_write": ("p2p_write", "--p2p-write"),
    "numactl": ("numactl", "--numactl"),
    "lscpu": ("lscpu", "--lscpu"),
    "query_gpu": ("query_gpu", "--query-gpu"),
    "sysfs_numa": ("sysfs_numa", "--sysfs-numa"),
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topology",
        help="parse nvidia-smi/numactl/lscpu outputs and plan the vLLM instances of one host",
        description=(
            "Parse a host's GPU/NUMA topology from raw command outputs (files may hold surrounding text, "
            "e.g. a pasted issue) and print the probe report: GPUs, links, P2P, NUMA, and the planned "
            "instances with their reasons. Give --topo-m, or --recorded DIR holding "
            f"{', '.join(sorted(RECORDED_FILES.values()))} (files given explicitly override the folder's)."
        ),
    )
    parser.add_argument("--topo-m", metavar="FILE", help="output of `nvidia-smi topo -m`")
    parser.add_argument("--p2p", metavar="FILE", help="output of `nvidia-smi topo -p2p r` (or `rw`)")
    parser.add_argument("--p2p-write", metavar="FILE", help="output of `nvidia-smi topo -p2p w`")
    parser.add_argument("--numactl", metavar="FILE", help="output of `numactl --hardware`")
    parser.add_argument("--lscpu", metavar="FILE", help="output of `lscpu` (or `lscpu -J`)")
    parser.add_argument(
        "--query-gpu", metavar="FILE", help="output of `nvidia-smi --query-gpu=... --format=csv`"
    )
    parser.add_argument(
        "--sysfs-numa", metavar="FILE", help="output of `grep -H . /sys/bus/pci/devices/*/numa_node`"
    )
    parser.add_argument("--recorded", metavar="DIR", help="a recorded-hardware folder (fixed file names)")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, metavar="N", help="GPUs per instance")
    parser.add_argument("--model-config", metavar="FILE", help="the model's config.json (attention/KV heads)")
    parser.add_argument("--num-attention-heads", type=int, metavar="N")
    parser.add_argument("--num-key-value-heads", type=int, metavar="N")
    parser.add_argument("--vllm-version", metavar="V", help="target vLLM release (decides --numa-bind)")
    parser.add_argument("--base-port", type=int, default=8000, metavar="PORT", help="port of instance i0")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    texts: dict[str, str] = read_recorded_dir(args.recorded) if args.recorded else {}
    for dest, (key, flag) in _INPUTS.items():
        path = getattr(args, dest)
        if path:
            texts[key] = read_input_file(path, flag)
    if not args.recorded and "topo_m" not in texts:
        raise FleetInputError(
            "give --topo-m FILE (the output of `nvidia-smi topo -m`) or --recorded DIR; see --help"
        )
    topology = build_topology_from_texts(texts, allow_incomplete=True)
    where = f"--model-config {args.model_config!r}"
    config = (
        parse_model_config(read_model_config_file(args.model_config, "--model-config"), where)
        if args.model_config
        else None
    )
    if not topology.complete:
        # Report what a truncated paste holds, but plan nothing from it.
        why = (
            f"not planned: topo -m rows {', '.join(topology.missing_rows)} are missing (truncated paste?); "
            "give the whole `nvidia-smi topo -m` output"
        )
        print(terminal_safe(f"vllm-fleet topology: warning: {why}"), file=sys.stderr)
        layout = Layout(instances=[], tensor_parallel_size=0, warnings=[why])
    else:
        layout = plan_layout(
            topology,
            args.tensor_parallel_size,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_key_value_heads,
            model_config=config,
            vllm_version=args.vllm_version,
            base_port=args.base_port,
        )
    plan = layout.to_dict()
    result = {
        **topology.to_dict(),
        "layout": plan["instances"],
        "tensor_parallel_size": plan["tensor_parallel_size"],
        "idle_gpus": plan["idle_gpus"],
        "cpu_only": topology.cpu_only,
        "layout_reasons": plan["reasons"],
        "layout_warnings": plan["warnings"],
    }
    emit(result, args.json, format_probe_report(topology, layout))
    return 0
