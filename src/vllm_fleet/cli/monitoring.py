"""`vllm-fleet monitoring --inventory PATH --out DIR`: Prometheus config, alert rules and a Grafana dashboard.

Every instance of every host's plan (the plan `vllm-fleet plan --inventory` prints, or with --plans the one
preflight saved and deploy applied) is a scrape target; the
alert thresholds come from each plan and from verify's pass marks (the host's vllm_verify_* variables, else
roles/vllm_verify/defaults/main.yml). Exit status 0 with the files written; 2 on unusable input.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_fleet.cli import emit, read_json_input
from vllm_fleet.errors import FleetInputError
from vllm_fleet.monitoring.files import monitoring_files, write_files
from vllm_fleet.monitoring.rules import Limits, limits_from
from vllm_fleet.monitoring.targets import GPU_EXPORTER_PORT, NODE_EXPORTER_PORT, parse_duration_seconds
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.plan.inventory import plan_inventory
from vllm_fleet.project import project_dir
from vllm_fleet.verify.report import Thresholds

VERIFY_MARKS = ("vllm_verify_spec_acceptance_min", "vllm_verify_ttft_p99_max", "vllm_verify_max_restarts")


def thresholds_of(variables: dict[str, Any], host: str) -> Thresholds:
    """verify's Thresholds from a host's vllm_verify_* variables (0 is off, as for verify)."""
    try:
        spec = float(variables["vllm_verify_spec_acceptance_min"])
        ttft = float(variables["vllm_verify_ttft_p99_max"])
        restarts = int(variables["vllm_verify_max_restarts"])
    except (TypeError, ValueError) as exc:
        raise FleetInputError(
            f"{host}: {', '.join(VERIFY_MARKS)} must be numbers ({exc}); fix them in the inventory"
        ) from exc
    return Thresholds(spec_acceptance_min=spec, ttft_p99_max_s=ttft or None, max_restarts=restarts)


def inventory_settings(inventory: str, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """Per host: the address Prometheus dials (ansible_host, else the name) and verify's marks."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    from vllm_fleet.plan.inventory import role_defaults

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[inventory])
    variables_of = VariableManager(loader=loader, inventory=manager)
    defaults = role_defaults(project_dir() / "roles")
    settings = {}
    for name in hosts:
        host_vars = variables_of.get_vars(host=manager.get_host(name), include_hostvars=False)
        marks = {mark: host_vars.get(mark, defaults.get(mark)) for mark in VERIFY_MARKS}
        settings[name] = {"address": str(host_vars.get("ansible_host") or name), **marks}
    return settings


def inventory_hosts(inventory: str, limit: str | None) -> list[str]:
    """The inventory's host names (those `limit` selects), in inventory order."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[inventory])
    if limit:
        manager.subset(limit)
    hosts = [host.name for host in manager.get_hosts()]
    if not hosts:
        raise FleetInputError(
            f"--inventory {inventory}: no hosts{f' match --limit {limit}' if limit else ''}"
        )
    return hosts


def saved_plans(plans_dir: Path, hosts: list[str]) -> dict[str, HostPlan]:
    """The plans preflight wrote (<dir>/<host>.json): what deploy applied, the model's config.json read on
    the host included, which a plan rebuilt on the controller may lack."""
    plans = {}
    for host in hosts:
        path = plans_dir / f"{host}.json"
        if not path.is_file():
            raise FleetInputError(
                f"--plans {plans_dir}: no plan for {host} ({path} missing); run playbooks/preflight.yml "
                "(or deploy.yml, site.yml) with this inventory first, or leave --plans out to plan from "
                "the inventory"
            )
        data = read_json_input(str(path), f"--plans {plans_dir}", "run preflight again")
        plans[host] = HostPlan.from_dict(data, where=str(path))
    return plans


def fleet_plans(args: argparse.Namespace) -> dict[str, HostPlan]:
    """Every host's plan, from --plans (what preflight saved) or planned from --inventory and --facts; a host
    without a clean plan is refused (the arguments of add_plan_source_arguments)."""
    plans: dict[str, HostPlan]
    if args.plans:
        plans = saved_plans(Path(args.plans), inventory_hosts(args.inventory, args.limit))
    else:
        facts = Path(args.facts) if args.facts else None
        plans = plan_inventory(args.inventory, project_dir=project_dir(), limit=args.limit, probe_dir=facts)
    failed = {host: plan.errors for host, plan in plans.items() if not plan.ok}
    if failed:
        raise FleetInputError(
            f"--inventory {args.inventory}: no plan for {', '.join(failed)} ({failed}); "
            "fix what `vllm-fleet plan --inventory` reports first"
        )
    return plans


def add_plan_source_arguments(parser: argparse.ArgumentParser, out_help: str, limit_help: str) -> None:
    """--inventory, --out, --facts, --plans and --limit, as fleet_plans reads them."""
    parser.add_argument("--inventory", required=True, help="the Ansible inventory (file or folder)")
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--facts", help="the probe's reports folder (default: reports/probe)")
    parser.add_argument(
        "--plans",
        help="the plans preflight wrote (reports/plan, one <host>.json per host): use those instead of "
        "planning from the inventory and --facts",
    )
    parser.add_argument("--limit", help=limit_help)


def _handle(args: argparse.Namespace) -> int:
    for value, option in ((args.alert_for, "--alert-for"), (args.down_for, "--down-for")):
        parse_duration_seconds(value, option)  # refused before the (slow) plan is built
    plans = fleet_plans(args)
    settings = inventory_settings(args.inventory, list(plans))
    monitoring = {
        "ttft_p99_max_s": args.ttft_p99_max,
        "kv_usage_max": args.kv_usage_max,
        "prefix_hit_rate_min": args.prefix_hit_rate_min,
        "for_": args.alert_for,
        "down_for": args.down_for,
    }
    host_limits = {h: limits_from(thresholds_of(s, h), **monitoring) for h, s in settings.items()}
    files = monitoring_files(
        plans,
        {h: s["address"] for h, s in settings.items()},
        fleet=args.fleet or Path(args.inventory).resolve().name.removesuffix(".yml"),
        limits=Limits(**monitoring),
        host_limits=host_limits,
        scrape_interval=args.scrape_interval,
        node_exporter_port=args.node_exporter_port,
        gpu_exporter_port=args.gpu_exporter_port,
    )
    written = write_files(files, Path(args.out))
    targets = sum(len(p.instances) for p in plans.values())
    human = "\n".join(str(p) for p in written) + f"\n{targets} vLLM instance(s) on {len(plans)} host(s)"
    emit({"files": [str(p) for p in written], "hosts": list(plans), "instances": targets}, args.json, human)
    return 0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction between 0 and 1 (0.9 is 90 %)")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "monitoring",
        help="write prometheus.yml, alert rules and a Grafana dashboard for the fleet's plans",
        description="Prometheus targets from every host's plan, alert rules from the plans' own thresholds "
        "and verify's limits, and a Grafana dashboard.",
    )
    add_plan_source_arguments(
        parser,
        out_help="folder to write prometheus.yml, rules/ and grafana/ to",
        limit_help="only these hosts (an Ansible host pattern)",
    )
    parser.add_argument("--fleet", help="the fleet label (default: the inventory's name)")
    parser.add_argument("--scrape-interval", default="15s", help="Prometheus scrape interval (default: 15s)")
    parser.add_argument("--node-exporter-port", type=int, default=NODE_EXPORTER_PORT, help="0: none")
    parser.add_argument("--gpu-exporter-port", type=int, default=GPU_EXPORTER_PORT, help="0: none")
    parser.add_argument(
        "--ttft-p99-max",
        type=float,
        default=2.0,
        help="TTFT P99 mark (s) where vllm_verify_ttft_p99_max is 0",
    )
    parser.add_argument("--kv-usage-max", type=_fraction, default=0.9, help="KV cache usage mark (fraction)")
    parser.add_argument(
        "--prefix-hit-rate-min", type=_fraction, default=0.05, help="prefix-cache hit rate mark (fraction)"
    )
    parser.add_argument(
        "--alert-for",
        default=Limits.for_,
        help=f"how long a load condition (TTFT, queue, KV...) must hold to fire (default: {Limits.for_})",
    )
    parser.add_argument(
        "--down-for",
        default=Limits.down_for,
        help=f"how long /metrics must fail to fire VllmInstanceDown (default: {Limits.down_for})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
