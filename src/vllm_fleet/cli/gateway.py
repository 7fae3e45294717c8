"""`vllm-fleet gateway --inventory PATH --out DIR`: haproxy.cfg for the gateway in front of the fleet.

Every instance of every host's plan (the plan `vllm-fleet plan --inventory` prints, or with --plans the one
preflight saved and deploy applied) is a server of the backend of its host's instance set
(`vllm_service_instance_set`: long, short or a name of yours; default long). Requests go to the smallest set
whose planned max_model_len their body fits (vllm_fleet.gateway.sets says how bytes stand for tokens). The
vLLM hosts are those --limit selects (the playbooks' vllm_fleet_hosts; default all): a gateway host may run
vLLM too, a dedicated one is left out with e.g. --limit 'all:!gateway'. Exit status 0 with DIR/haproxy.cfg and
DIR/gateway.json written; 2 on unusable input (nothing written).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_fleet.cli import emit
from vllm_fleet.cli.monitoring import add_plan_source_arguments, fleet_plans
from vllm_fleet.gateway.files import gateway_files, write_files
from vllm_fleet.gateway.haproxy import PORT, RUNTIME_SOCKET, GatewaySettings
from vllm_fleet.gateway.sets import BYTES_PER_TOKEN, DEFAULT_SET, MARGIN, SET_VARIABLE, instance_sets


def host_settings(inventory: str, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """Per host: the address the gateway dials (ansible_host, else the name) and its instance set."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[inventory])
    variables_of = VariableManager(loader=loader, inventory=manager)
    settings = {}
    for name in hosts:
        host_vars = variables_of.get_vars(host=manager.get_host(name), include_hostvars=False)
        settings[name] = {
            "address": str(host_vars.get("ansible_host") or name),
            "set": host_vars.get(SET_VARIABLE) or DEFAULT_SET,
        }
    return settings


def _handle(args: argparse.Namespace) -> int:
    settings = GatewaySettings(
        listen_address=args.listen_address,
        port=args.port,
        keyed=args.keyed,
        allow_unauthenticated=args.allow_unauthenticated,
        runtime_socket=args.runtime_socket,
        check_interval_s=args.check_interval,
        check_fast_interval_s=args.check_fast_interval,
        server_timeout_s=args.server_timeout,
        client_timeout_s=args.server_timeout,
    )  # refused before the (slow) plan is built
    plans = fleet_plans(args)
    per_host = host_settings(args.inventory, list(plans))
    sets = instance_sets(
        plans,
        {h: s["set"] for h, s in per_host.items()},
        {h: s["address"] for h, s in per_host.items()},
        gateway_host=args.gateway_host,
        bytes_per_token=args.bytes_per_token,
        margin=args.margin,
    )
    source = f"the plans of {', '.join(plans)} ({args.plans or 'planned from ' + args.inventory})"
    written = write_files(gateway_files(sets, settings, source=source), Path(args.out))
    lines = [str(p) for p in written]
    for s in sets:
        route = f"bodies <= {s.threshold_bytes} bytes" if s.threshold_bytes else "the rest"
        lines.append(f"set {s.name}: {len(s.servers)} instance(s), max_model_len {s.max_model_len}, {route}")
    summary = {
        "files": [str(p) for p in written],
        "sets": {s.name: [srv.name for srv in s.servers] for s in sets},
        "thresholds": {s.name: s.threshold_bytes for s in sets},
    }
    emit(summary, args.json, "\n".join(lines))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="write haproxy.cfg for the gateway in front of the fleet's plans",
        description="HAProxy in front of every planned instance: one backend per instance set, requests "
        "routed by size, a real generation as the readiness check, the runtime API for drains.",
    )
    add_plan_source_arguments(
        parser,
        out_help="folder to write haproxy.cfg and gateway.json to",
        limit_help="the vLLM hosts (an Ansible host pattern, the playbooks' vllm_fleet_hosts; default all)",
    )
    parser.add_argument(
        "--gateway-host",
        help="the inventory host the gateway runs on (instances on loopback are reachable from it only)",
    )
    parser.add_argument("--listen-address", default="127.0.0.1", help="where the gateway listens")
    parser.add_argument("--port", type=int, default=PORT, help=f"the gateway's port (default: {PORT})")
    parser.add_argument(
        "--keyed",
        action="store_true",
        help="clients must send the key (HAProxy reads it from its environment, never from the config)",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="listen beyond loopback without a key, on purpose",
    )
    parser.add_argument("--runtime-socket", default=RUNTIME_SOCKET, help="the runtime API's socket")
    parser.add_argument("--check-interval", type=int, default=5, help="seconds between readiness checks")
    parser.add_argument(
        "--check-fast-interval",
        type=int,
        default=0,
        help="seconds between checks of a server that changes state or is down (0: the check interval)",
    )
    parser.add_argument(
        "--server-timeout", type=int, default=600, help="seconds a request may go without a byte either way"
    )
    parser.add_argument(
        "--bytes-per-token", type=float, default=BYTES_PER_TOKEN, help="bytes of request body per token"
    )
    parser.add_argument(
        "--margin", type=float, default=MARGIN, help="fraction of a set's max_model_len kept free (output...)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
