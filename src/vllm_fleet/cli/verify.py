"""`vllm-fleet verify`: the vllm_verify role's checks for a vLLM that no systemd unit of this toolkit runs.

    vllm-fleet verify --plan /etc/vllm-fleet/i0.json [--log vllm.log] [--url http://127.0.0.1:8000] \
        [--wait 600 [--pid PID]] [--json] [--report-dir DIR] [--record FILE | --replay FILE]

`--plan` is an instance plan: the file deploy writes (/etc/vllm-fleet/<instance>.json) or the output of
`vllm-fleet render --json`. The checks are the role's (`vllm_fleet.verify.report.build_report`): the startup
log against the plan (with --log), readiness, /health, /v1/models, a completion and a chat completion,
/metrics, prefix-cache hits, speculative acceptance and TTFT over a short warm-up. Only the restarts check
is left out: without systemd nothing counts restarts. `--record` keeps the raw answers; `--replay` judges
recorded answers again without a server.

Exit status: 0 when every check passed, 1 when a check failed (the report says which), 2 when an input is
unusable (message on stderr naming it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

from vllm_fleet.cli import emit, read_json_input
from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import check_shape
from vllm_fleet.plan.build import unit_name
from vllm_fleet.plan.host import InstanceNeeds, InstancePlan
from vllm_fleet.verify import live
from vllm_fleet.verify.metrics import parse_prometheus
from vllm_fleet.verify.report import (
    ApiTarget,
    Thresholds,
    api_target,
    build_report,
    failure_message,
    save_report,
)


def _option(argv: list[str], flag: str) -> str | None:
    """The value of `--flag value` / `--flag=value` in a serve argv (None when absent)."""
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(f"{flag}="):
            return word.split("=", 1)[1]
    return None


def _cpu_tier_bytes(kv_transfer_config: str | None) -> int:
    """The CPU KV tier of a rendered `--kv-transfer-config` (OffloadingConnector's cpu_bytes_to_use), or 0."""
    try:
        config = json.loads(kv_transfer_config or "{}")
    except ValueError:
        return 0
    extra = config.get("kv_connector_extra_config") if isinstance(config, dict) else None
    value = extra.get("cpu_bytes_to_use") if isinstance(extra, dict) else None
    return int(value) if isinstance(value, (int, float)) and value > 0 else 0


# `vllm-fleet render --json`: the fields verify reads, and the expectations among them
RENDERED_FIELDS: dict[str, Any] = {
    "name": str,
    "argv": list[str],
    "exec_start": str,
    "shell": str,
    "env": dict[str, str],
    "secret_env_names": list[str],
    "port": int | None,
    "vllm_version": str,
    "catalog_release": str,
    "expectations": dict[str, Any] | None,
    "warnings": list[str] | None,
    "errors": list[str] | None,
}
RENDERED_EXPECTATIONS: dict[str, Any] = {
    "served_model_name": str | None,
    "tensor_parallel_size": int | None,
    "max_model_len": int | None,
    "numa_binding": dict[str, Any] | None,
    "capacity": dict[str, Any] | None,
    "spec_decode": bool | None,
    "port": int | None,
}
# `verify --record`: readiness, the API's answers (one HTTP answer per request) and the two scrapes
RECORDED_FIELDS: dict[str, Any] = {
    "readiness": dict[str, Any],
    "api": dict[str, dict[str, Any] | None],
    "metrics_before": str | None,
    "metrics_after": str | None,
    "warmup": list[Any] | None,
    "probe_prompt": str | None,
}


def plan_from_rendered(data: dict[str, Any], where: str) -> InstancePlan:
    """An InstancePlan from `vllm-fleet render --json` output (what the renderer knows; no host, no layout).

    What the API checks need comes from the rendered argv itself: the model, the served name, --host, and
    whether prefix caching was turned off.
    """
    fix = "give the output of `vllm-fleet render --json` as it printed it"
    check_shape(data, RENDERED_FIELDS, where, fix)
    check_shape(data.get("expectations") or {}, RENDERED_EXPECTATIONS, f"{where} expectations", fix)
    argv = [str(w) for w in data["argv"]]
    serve = argv.index("serve") if "serve" in argv else -1
    model = argv[serve + 1] if 0 <= serve < len(argv) - 1 else (_option(argv, "--model") or "")
    expectations = dict(data.get("expectations") or {})
    capacity = expectations.pop("capacity", None)
    name = str(data.get("name") or "")
    port = data.get("port") or _option(argv, "--port") or 8000
    try:
        port = int(port)
    except (TypeError, ValueError) as exc:
        raise FleetInputError(f"{where}: port {port!r} is not an integer") from exc
    served = expectations.get("served_model_name") or _option(argv, "--served-model-name") or model
    tier = _cpu_tier_bytes(_option(argv, "--kv-transfer-config"))
    return InstancePlan(
        name=name,
        host="",
        unit=unit_name(name),
        vllm_version=str(data.get("vllm_version") or ""),
        catalog_release=str(data.get("catalog_release") or ""),
        model=model,
        served_model_name=served,
        max_model_len=expectations.get("max_model_len"),
        address=_option(argv, "--host") or "",
        port=port,
        device="",
        gpus=[],
        tensor_parallel_size=int(expectations.get("tensor_parallel_size") or 1),
        numa_binding=dict(expectations.get("numa_binding") or {}),
        argv=argv,
        exec_start=str(data.get("exec_start") or ""),
        shell=str(data.get("shell") or ""),
        env=dict(data.get("env") or {}),
        secret_env_names=list(data.get("secret_env_names") or []),
        prefix_caching="--no-enable-prefix-caching" not in argv,
        spec_decode=bool(expectations.get("spec_decode", "--speculative-config" in argv)),
        capacity=capacity,
        expectations=expectations,
        needs=InstanceNeeds(cpu_kv_bytes=tier),
        layout={},
        warnings=list(data.get("warnings") or []),
    )


def load_plan(path: str) -> tuple[InstancePlan, ApiTarget]:
    """The instance plan of `--plan` and its API target: the one place this command reads a plan.

    Either the file deploy writes (/etc/vllm-fleet/<instance>.json: an InstancePlan) or the output of
    `vllm-fleet render --json` (no schema_version: the rendered command and its expectations).
    """
    where = f"--plan {path!r}"
    data = read_json_input(
        path, "--plan", "give /etc/vllm-fleet/<instance>.json or the output of `vllm-fleet render --json`"
    )
    if not isinstance(data, dict):
        raise FleetInputError(f"{where} must hold one JSON object (an instance plan)")
    if "schema_version" in data:
        plan = InstancePlan.from_dict(data, where=where)
    elif data.get("argv") and data.get("name"):
        plan = plan_from_rendered(data, where)
    else:
        raise FleetInputError(
            f"{where} has no argv; give /etc/vllm-fleet/<instance>.json or the output of "
            "`vllm-fleet render --json`"
        )
    return plan, api_target(plan)


def _request(args: argparse.Namespace) -> live.Request:
    key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""
    if args.max_tokens < 1 or args.warmup_requests < 0:
        raise FleetInputError(
            f"--max-tokens {args.max_tokens} / --warmup-requests {args.warmup_requests}: give at least 1 "
            "token and 0 or more requests"
        )
    return live.Request(
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        warmup_requests=args.warmup_requests,
        timeout_s=args.request_timeout,
        api_key=key,
    )


def _answers(args: argparse.Namespace, target: ApiTarget) -> dict[str, Any]:
    """Readiness and the API's answers: live from the server, or recorded (--replay)."""
    if args.replay:
        data = read_json_input(args.replay, "--replay", "give a file written by `verify --record`")
        if not isinstance(data, dict) or "readiness" not in data:
            raise FleetInputError(f"--replay: {args.replay!r} is not a file written by `verify --record`")
        fix = "give a file written by `verify --record`"
        check_shape(data, RECORDED_FIELDS, f"--replay {args.replay!r}", fix)
        for key in ("metrics_before", "metrics_after"):
            try:
                parse_prometheus(data.get(key) or "")
            except FleetInputError as exc:
                raise FleetInputError(f"--replay {args.replay!r}: {key}: {exc}") from exc
        data.setdefault("api", {})
        data.setdefault("metrics_before", "")
        data.setdefault("metrics_after", "")
        return data
    if args.wait < 0:
        raise FleetInputError(f"--wait {args.wait}: give seconds >= 0 (0: one poll)")
    readiness = live.wait_ready(target, timeout_s=args.wait, log_path=args.log, pid=args.pid)
    answers: dict[str, Any] = {"readiness": readiness, "api": {}, "metrics_before": "", "metrics_after": ""}
    if readiness["state"] == "ready":
        answers.update(live.gather(target, _request(args)))
    return answers


def _handle(args: argparse.Namespace) -> int:
    plan, target = load_plan(args.plan)
    target = live.target_at(target, args.url)
    thresholds = Thresholds(
        spec_acceptance_min=args.spec_acceptance_min if args.spec_acceptance_min >= 0 else None,
        ttft_p99_max_s=args.ttft_p99_max if args.ttft_p99_max > 0 else None,
    )
    answers = _answers(args, target)
    journal = live.read_log(args.log) if args.log else None
    if args.log and not journal:
        raise FleetInputError(f"--log: {args.log!r} is empty or missing; give the server's output file")
    if args.record:
        Path(args.record).write_text(json.dumps(answers, indent=2) + "\n", encoding="utf-8")
    report = build_report(
        host=args.host,
        plan=plan,
        journal=journal,
        unit_show=None,
        api=answers["api"],
        metrics_before=answers["metrics_before"] or None,
        metrics_after=answers["metrics_after"] or None,
        thresholds=thresholds,
        readiness=answers["readiness"],
        address=target.address,
    )
    data = report.to_dict()
    data["target"]["base_url"] = target.base_url
    if args.report_dir:
        save_report(args.report_dir, data)
    lines = [f"{c['name']:<28} {'OK' if c['ok'] else 'FAIL':<4} {c['seen']}" for c in data["checks"]]
    if answers["readiness"].get("msg"):
        lines.append(answers["readiness"]["msg"])
    if not report.ok:
        lines.append(failure_message(data))
    lines.append(f"{data['host']}/{data['instance']}: {'OK' if report.ok else 'FAILED'}")
    emit(data, args.json, "\n".join(lines))
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check a running vLLM (no systemd needed) against its instance plan, as the verify role does",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--plan", required=True, help="instance plan: /etc/vllm-fleet/<i>.json or render --json output"
    )
    parser.add_argument("--log", help="the server's output file (stdout+stderr): enables the log checks")
    parser.add_argument("--url", help="base URL of the server (default: the plan's --host and --port)")
    parser.add_argument(
        "--wait", type=float, default=0, help="seconds to wait for /health (default 0: one poll)"
    )
    parser.add_argument("--pid", type=int, help="the server's PID: a start that died ends the wait at once")
    parser.add_argument("--host", default=socket.gethostname(), help="host name in the report")
    parser.add_argument("--prompt", default=live.DEFAULT_PROMPT, help="prompt of the test requests")
    parser.add_argument("--max-tokens", type=int, default=live.DEFAULT_MAX_TOKENS)
    parser.add_argument("--warmup-requests", type=int, default=live.DEFAULT_WARMUP_REQUESTS)
    parser.add_argument("--request-timeout", type=float, default=live.DEFAULT_REQUEST_TIMEOUT_S)
    parser.add_argument(
        "--api-key-env",
        default="VLLM_API_KEY",
        help="environment variable holding the API key (default VLLM_API_KEY; never printed)",
    )
    parser.add_argument(
        "--spec-acceptance-min", type=float, default=0.3, help="pass mark (0-1); < 0: report only"
    )
    parser.add_argument("--ttft-p99-max", type=float, default=0, help="seconds; 0: report TTFT only")
    parser.add_argument("--report-dir", help="also save the report as DIR/<host>--<instance>.json")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--record", help="write readiness and the raw API answers to FILE")
    group.add_argument("--replay", help="judge the answers recorded in FILE instead of calling a server")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(handler=_handle)
