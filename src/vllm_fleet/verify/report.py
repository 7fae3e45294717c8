"""Post-deploy verification: readiness, API and metrics checks, per-instance JSON reports, the fleet table.

The verify role gathers raw text on each host (systemctl show, the journal of the current start, the API's
answers, /metrics) and hands it here; the startup-log checks themselves are `vllm_fleet.verify.logcheck`'s,
so the
role and `vllm-fleet logcheck` give the same verdict for the same journal.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import write_json
from vllm_fleet.plan.host import InstancePlan, connect_address
from vllm_fleet.texttable import fmt, text_table
from vllm_fleet.verify.logcheck import EXPECTATION_KEYS as LOG_EXPECTATION_KEYS
from vllm_fleet.verify.logcheck import Check, check_log, parse_log
from vllm_fleet.verify.metrics import MetricsSummary, summarize_metrics

REPORT_VERSION = 1

# --------------------------------------------------------------------------------------------- unit state


@dataclass(frozen=True)
class UnitState:
    """The few `systemctl show` properties that tell a loading instance from a crashed one."""

    active_state: str = ""
    sub_state: str = ""
    result: str = ""
    n_restarts: int = 0
    invocation_id: str = ""
    main_pid: int = 0
    exec_main_status: int | None = None
    # the id of a job systemd has queued or runs for the unit ("": none). A restart asked with no_block is
    # one: from its stop half to the new start's end, whatever the old process does is not the start awaited.
    job: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "active_state": self.active_state,
            "sub_state": self.sub_state,
            "result": self.result,
            "n_restarts": self.n_restarts,
            "invocation_id": self.invocation_id,
            "main_pid": self.main_pid,
            "exec_main_status": self.exec_main_status,
            "job": self.job,
        }


SYSTEMCTL_PROPERTIES = (
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "InvocationID",
    "MainPID",
    "ExecMainStatus",
    "LoadState",
    "Job",
)


# What the report keeps of the readiness wait's result (vllm_fleet_wait).
READINESS_KEPT = (
    "state",
    "reason",
    "waited_s",
    "timeout",
    "polls",
    "progress_lines",
    "invocation_id",
    "unit_show",
)


def _int_or(value: str | None, default: int | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def parse_systemctl_show(text: str, unit: str = "the unit") -> UnitState:
    """Read `systemctl show -p ActiveState,SubState,...` (`Key=Value` lines)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    if props.get("LoadState") == "not-found":
        raise FleetInputError(
            f"{unit}: systemd has no such unit (LoadState=not-found); deploy it first (playbooks/deploy.yml) "
            "or fix vllm_verify_instances"
        )
    if "ActiveState" not in props:
        raise FleetInputError(f"{unit}: `systemctl show` printed no ActiveState; got {text[:200]!r}")
    return UnitState(
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        result=props.get("Result", ""),
        n_restarts=_int_or(props.get("NRestarts"), 0) or 0,
        invocation_id=props.get("InvocationID", ""),
        main_pid=_int_or(props.get("MainPID"), 0) or 0,
        exec_main_status=_int_or(props.get("ExecMainStatus"), None),
        job=props.get("Job", ""),
    )


# ---------------------------------------------------------------------------------------------- readiness


@dataclass(frozen=True)
class Readiness:
    """One poll's verdict. `state`: ready | starting | crashed | engine_dead | stopped."""

    state: str
    reason: str

    @property
    def final(self) -> bool:
        return self.state != "starting"


def classify_readiness(
    unit: UnitState,
    baseline: UnitState | None,
    health_status: int | None,
    *,
    headless: bool = False,
    joined: bool = True,
) -> Readiness:
    """Decide from the unit's state and /health's answer (None: connection refused or no answer).

    `headless`: a rank > 0 of a multi-host instance has no API; it is ready when its unit runs and its
    workers `joined` rank 0's world (its log's `rank R in world size N` line, `hostread.headless_joined`):
    before that its log lacks the lines verify checks (seen on two lab hosts: a rank read right after its
    start showed neither its max model length nor its PP rank).

    `baseline` is the state seen at the first poll: a restart since then (NRestarts up, a new InvocationID)
    means the start being waited on died, even if the new start is loading again.
    """
    if baseline is not None and unit.n_restarts > baseline.n_restarts:
        return Readiness(
            "crashed",
            f"systemd restarted the unit (NRestarts {baseline.n_restarts} -> {unit.n_restarts}): the process "
            "exited while loading",
        )
    if (
        baseline is not None
        and baseline.invocation_id
        and not baseline.job  # a restart was queued at the first poll: the new start is the one awaited
        and baseline.active_state != "deactivating"  # the stop half of a restart: the next start is awaited
        and unit.invocation_id not in ("", baseline.invocation_id)
    ):
        return Readiness(
            "crashed", "the unit was started again (new InvocationID) while it was being waited on"
        )
    if unit.job:
        # a (re)start is queued or under way (vllm_service asks with no_block): neither the old process's
        # answer before its stop nor its exit during it is the start awaited (with KillMode=mixed the stop's
        # Result can read exit-code while systemd kills what the API server left). The new start's crash is
        # caught once the job is done (failed, auto-restart) or by NRestarts.
        return Readiness(
            "starting",
            f"systemd's job {unit.job} (re)starts the unit; it is {unit.active_state}/{unit.sub_state}",
        )
    if unit.active_state == "failed":
        return Readiness(
            "crashed", f"the unit failed (Result={unit.result}, exit status {unit.exec_main_status})"
        )
    if unit.sub_state == "auto-restart":
        return Readiness(
            "crashed",
            f"the process exited (Result={unit.result}, exit status {unit.exec_main_status}) and "
            "systemd is about to restart it",
        )
    if unit.active_state == "deactivating" and unit.result not in ("", "success"):
        # the main process died; systemd is stopping what it left (vLLM's engine processes) before the
        # restart or the failed state: seen live in a lab host, tests/fixtures/metrics/systemctl/
        return Readiness(
            "crashed",
            f"the process exited (Result={unit.result}, exit status {unit.exec_main_status}) and systemd is "
            "stopping what it left",
        )
    if unit.active_state == "deactivating":
        # a stop in progress: with --shutdown-timeout vLLM finishes its requests in flight first, for minutes
        # under load, and the restart that vllm_service asked for (no_block) starts it after; a plain stop
        # ends inactive, which the next poll calls stopped (seen in lab gw: a restart under 8 streams)
        return Readiness("starting", "the unit is stopping (vLLM drains its requests in flight) first")
    if unit.active_state == "inactive":
        return Readiness("stopped", f"the unit is {unit.active_state} (Result={unit.result}); start it first")
    if headless:
        if unit.active_state == "active" and joined:
            return Readiness("ready", "the headless rank's unit is active and its workers joined the world")
        if unit.active_state == "active":
            return Readiness("starting", "the headless rank's workers have not joined rank 0's world yet")
        return Readiness("starting", f"the headless rank's unit is {unit.active_state}")
    if health_status == 200 and unit.active_state == "activating":
        # vllm_service's ExecStartPost polls /health too; until it has seen the answer the unit is still
        # "activating (start-post)", and a check of its state taken now would fail a healthy start.
        return Readiness("starting", "/health answered 200; the unit's start is completing (start-post)")
    if health_status == 200:
        return Readiness("ready", "/health answered 200")
    if health_status == 503:
        return Readiness("engine_dead", "/health answered 503: the API server is up but its engine died")
    if health_status is None:
        return Readiness("starting", "the API port refuses connections (model still loading)")
    return Readiness("starting", f"/health answered {health_status}")


def awaited_start(baseline: UnitState, awaited: UnitState | None, unit: UnitState) -> UnitState:
    """The start the wait is about, as last seen: the first poll's (`baseline`) or, when the first poll found
    a restart under way (a queued job, or the old process stopping), the first new start after it. Its
    InvocationID picks the journal to check and the start the report vouches for; its PID, the lines."""
    if awaited is None:
        return unit
    restarting = bool(baseline.job) or baseline.active_state == "deactivating"
    moved_on = unit.invocation_id not in ("", baseline.invocation_id)
    if restarting and awaited.invocation_id == baseline.invocation_id and moved_on:
        return unit
    return unit if unit.invocation_id == awaited.invocation_id else awaited


GIB = 1 << 30


def ready_timeout(
    model_bytes: int | None, *, base_s: int = 600, per_gib_s: int = 20, cap_s: int = 3600
) -> int:
    """The readiness deadline for a model of `model_bytes` of weights (unknown: the base).

    Why these figures: engine start without the weights (imports, profiling, torch.compile, CUDA-graph
    capture) takes up to ~5 minutes on a GPU host, and the tiny lab model took 300 s on a busy shared
    machine; a crash ends the wait at the next poll anyway, so a generous deadline only costs time when a
    start truly hangs. Reading weights from local disk into the GPUs runs at well over 0.05 GiB/s, so 20 s
    per GiB leaves room for slow disks.
    """
    if model_bytes is None or model_bytes <= 0:
        return base_s
    return min(cap_s, base_s + math.ceil(model_bytes / GIB) * per_gib_s)


# ---------------------------------------------------------------------------------------- instance plan


@dataclass(frozen=True)
class ApiTarget:
    """What the API checks need to know about one instance, from its plan (`/etc/vllm-fleet/<i>.json`)."""

    instance: str
    unit: str
    address: str
    port: int
    served_model_name: str
    max_model_len: int | None
    prefix_caching: bool
    spec_decode: bool
    model_path: str
    # --enable-prefix-caching given (not only vLLM's default, which is off for hybrid models)
    prefix_caching_explicit: bool = False
    kv_offload_cpu_bytes: int | None = None  # the CPU KV tier the plan asked for (cpu_bytes_to_use)
    headless: bool = False  # a rank > 0 of a multi-host instance: no API (its unit and log say it all)

    @property
    def base_url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "unit": self.unit,
            "address": self.address,
            "port": self.port,
            "base_url": self.base_url,
            "served_model_name": self.served_model_name,
            "max_model_len": self.max_model_len,
            "prefix_caching": self.prefix_caching,
            "spec_decode": self.spec_decode,
            "model_path": self.model_path,
            "prefix_caching_explicit": self.prefix_caching_explicit,
            # only on a headless rank (roles/vllm_verify sends it no request): other reports stay as they were
            **({"headless": True} if self.headless else {}),
        }


def api_target(plan: Mapping[str, Any] | InstancePlan, *, address: str | None = None) -> ApiTarget:
    """Where and what to ask, from an instance plan (`InstancePlan` or its JSON, the file deploy writes).

    The address is the one vLLM listens on (`--host`), so nothing needs to listen beyond what the inventory
    asks; a wildcard (or none) is reached on loopback."""
    if not isinstance(plan, InstancePlan):
        plan = InstancePlan.from_dict(plan)
    return ApiTarget(
        kv_offload_cpu_bytes=plan.expectations.get("kv_offload_cpu_bytes") or plan.needs.cpu_kv_bytes or None,
        instance=plan.name,
        unit=plan.unit,
        address=connect_address(address or plan.address),
        port=plan.port,
        served_model_name=plan.served_model_name,
        max_model_len=plan.max_model_len,
        prefix_caching=plan.prefix_caching,
        spec_decode=plan.spec_decode,
        model_path=plan.model,
        prefix_caching_explicit="--enable-prefix-caching" in plan.argv,
        headless=plan.headless,
    )


# ---------------------------------------------------------------------------------------------- journal

JOURNAL_ARGV = ("journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE,_PID,_STREAM_ID")


def _message(entry: Mapping[str, Any]) -> str:
    message = entry.get("MESSAGE", "")
    if isinstance(message, list):  # journald's JSON carries non-UTF-8 messages as byte arrays
        return bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode("utf-8", "replace")
    return str(message)


def journal_text(text: str, main_pid: int | None = None) -> str:
    """The log text of one start from `journalctl -o json` (`JOURNAL_ARGV`); other formats pass through.

    A process left over from an earlier start (vLLM's EngineCore outliving a stop) still writes to its old
    stdout stream, and journald files those lines under the unit's current invocation: seen in a lab host,
    an old EngineCore's "EngineCore failed to start" inside a healthy start's journal. With the start's
    main PID known, only the streams that process wrote to count (vLLM's children inherit them); without
    it (the process died before anyone saw its PID) every line counts, so a fatal line is never lost.
    """
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.startswith("{"):
            return text
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):  # not journald's JSON: a log line that starts with `{`
            return text
        if not isinstance(entry, dict):
            return text
        entries.append(entry)
    streams = {e.get("_STREAM_ID") for e in entries if main_pid and str(e.get("_PID")) == str(main_pid)}
    return "\n".join(_message(e) for e in entries if not streams or e.get("_STREAM_ID") in streams)


# ------------------------------------------------------------------------------------------ crash report

FATAL_HINTS = {
    "max_model_len_exceeds_kv_cache": "lower max_model_len, or give the KV cache more memory "
    "(gpu_memory_utilization, kv_cache_memory_bytes; VLLM_CPU_KVCACHE_SPACE on CPU)",
    "no_kv_cache_memory": "the weights and activations leave no memory for the KV cache: raise "
    "gpu_memory_utilization, add GPUs (tensor_parallel_size) or use a smaller/quantized model",
    "cuda_oom": "lower gpu_memory_utilization or max_num_seqs, or stop what else uses the GPU",
    "unrecognized_arguments": "the installed vLLM does not know a flag of the serve command: compare "
    "`vllm-fleet flags --vllm-version V` with the rendered argv, or pin the vLLM release the flags need",
    "negative_kv_cache_memory": "the weights and activations exceed the memory vLLM may use: raise "
    "gpu_memory_utilization, add GPUs (tensor_parallel_size) or use a smaller/quantized model",
    "insufficient_free_memory": "another process holds GPU memory: stop it, or lower gpu_memory_utilization",
    "invalid_kv_cache_dtype": "this vLLM release does not know the kv_cache_dtype: pick one of the values "
    "the error lists",
    "engine_init_failed": "the root cause is logged above this line in the same journal",
    "start_exception": "vLLM raised this while starting and never became ready: the message names the cause "
    "(a config.json this release cannot load, a kernel that did not build, ...); the traceback above it in "
    "the journal says where",
}


def log_errors(log_report: Any) -> list[tuple[str, str]]:
    """`(kind, line)` of each fatal error `logcheck.parse_log` found."""
    out = []
    for error in getattr(log_report, "errors", None) or []:
        if isinstance(error, Mapping):
            out.append((str(error.get("kind", "error")), str(error.get("line", ""))))
        else:
            out.append((str(getattr(error, "kind", "error")), str(getattr(error, "line", ""))))
    return out


def crash_message(
    unit: str, readiness: Readiness, journal: str, waited_s: float, main_pid: int | None = None
) -> tuple[str, list[dict[str, str]]]:
    """The failure message for an instance that died while loading: the fatal line, not a timeout."""
    errors = []
    text = journal_text(journal, main_pid)
    for kind, line in log_errors(parse_log(text)):
        if kind not in (k for k, _ in errors):  # vLLM logs the root cause twice (worker and traceback)
            errors.append((kind, line))
    # engine_init_failed is the wrapper; lead with the root cause when one was logged.
    errors.sort(key=lambda e: e[0] == "engine_init_failed")
    lines = [f"{unit} did not become ready: {readiness.reason} (after {waited_s:.0f} s)."]
    if errors:
        kind, line = errors[0]
        lines.append(f"Fatal log line ({kind}): {line.strip()}")
        if kind in FATAL_HINTS:
            lines.append(f"Fix: {FATAL_HINTS[kind]}.")
        lines.extend(f"Also logged ({k}): {ln.strip()}" for k, ln in errors[1:3])
    else:
        tail = [ln for ln in text.splitlines() if ln.strip()][-5:]
        lines.append("No known fatal line in this start's journal; its last lines:")
        lines.extend(f"  {ln}" for ln in tail)
    return "\n".join(lines), [{"kind": k, "line": ln} for k, ln in errors]


# ------------------------------------------------------------------------------------- prefix-cache probe


def cache_block_size(metrics_text: str | None) -> int | None:
    """The KV block size in effect, from /metrics' `vllm:cache_config_info` labels (None when absent)."""
    if not metrics_text:
        return None
    return block_size_of(summarize_metrics(metrics_text).cache_config)


def block_size_of(cache_config: Mapping[str, str]) -> int | None:
    """The block size of `vllm:cache_config_info` labels (the resolved one when vLLM reports both)."""
    for key in ("effective_attention_block_size", "block_size"):
        value = str(cache_config.get(key, ""))
        if value.isdigit():
            return int(value)
    return None


def probe_prompt(
    prompt: str, prompt_tokens: int | None, block_size: int | None, max_model_len: int | None, max_tokens: int
) -> str:
    """`prompt` repeated until it spans more than one KV block, within max_model_len.

    vLLM's prefix cache only hits whole blocks, and blocks differ (16 on most GPUs, 128 on CPU, hundreds
    for hybrid models), so a short prompt repeated shows no hits at all. `prompt_tokens` is what the server
    counted for one copy (the first completion's `usage.prompt_tokens`).
    """
    if not prompt_tokens or prompt_tokens <= 0:
        return prompt
    need = (block_size or 16) + 1
    copies = -(-need // prompt_tokens)
    if max_model_len:
        room = max_model_len - max_tokens - 1
        copies = max(1, min(copies, room // prompt_tokens))
    return " ".join([prompt] * copies)


# ------------------------------------------------------------------------------------------- API checks


def _mk(name: str, ok: bool, expected: Any, seen: Any, line: str = "", detail: str = "") -> Check:
    return Check(name=name, ok=ok, expected=expected, seen=seen, line=line, detail=detail)


def _status(resp: Mapping[str, Any] | None) -> int | None:
    if not resp:
        return None
    status = resp.get("status")
    return int(status) if isinstance(status, int) and status > 0 else None


def _json_body(resp: Mapping[str, Any] | None) -> dict[str, Any]:
    if not resp:
        return {}
    body = resp.get("json")
    if isinstance(body, dict):
        return body
    content = resp.get("content")
    if isinstance(content, str) and content.strip().startswith("{"):
        try:
            parsed = json.loads(content)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _where(target: ApiTarget, path: str) -> str:
    return (
        f"GET {target.base_url}{path}"
        if path in ("/health", "/v1/models", "/metrics")
        else (f"POST {target.base_url}{path}")
    )


def check_health(target: ApiTarget, resp: Mapping[str, Any] | None) -> Check:
    status = _status(resp)
    return _mk(
        "api_health",
        status == 200,
        200,
        status,
        _where(target, "/health"),
        "" if status == 200 else "no answer (connection refused?)" if status is None else "",
    )


def check_models(target: ApiTarget, resp: Mapping[str, Any] | None) -> list[Check]:
    body = _json_body(resp)
    cards = [c for c in body.get("data", []) if isinstance(c, dict)]
    card = next((c for c in cards if c.get("id") == target.served_model_name), None)
    ids = [c.get("id") for c in cards]
    checks = [
        _mk(
            "api_models_served_name",
            card is not None,
            target.served_model_name,
            ids,
            _where(target, "/v1/models"),
            f"status {_status(resp)}",
        )
    ]
    if target.max_model_len is not None:
        seen = card.get("max_model_len") if card else None
        checks.append(
            _mk(
                "api_models_max_model_len",
                seen == target.max_model_len,
                target.max_model_len,
                seen,
                _where(target, "/v1/models"),
            )
        )
    return checks


def _completion_tokens(body: Mapping[str, Any]) -> int:
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return int(usage.get("completion_tokens") or 0)


def check_completion(target: ApiTarget, name: str, path: str, resp: Mapping[str, Any] | None) -> Check:
    body = _json_body(resp)
    tokens = _completion_tokens(body)
    choices = body.get("choices") if isinstance(body.get("choices"), list) else []
    ok = _status(resp) == 200 and tokens > 0 and bool(choices)
    detail = f"status {_status(resp)}"
    if not ok and body.get("error"):
        detail += f": {json.dumps(body['error'])[:300]}"
    return _mk(
        name,
        ok,
        "status 200 with >= 1 completion token",
        f"{tokens} completion tokens",
        _where(target, path),
        detail,
    )


def check_metrics_endpoint(target: ApiTarget, resp: Mapping[str, Any] | None) -> Check:
    status = _status(resp)
    content = (resp or {}).get("content") or ""
    ok = status == 200 and "vllm:" in content
    return _mk(
        "api_metrics",
        ok,
        "status 200 with vllm:* metrics",
        f"status {status}, {len(content)} bytes",
        _where(target, "/metrics"),
    )


@dataclass(frozen=True)
class Thresholds:
    """Pass marks for the figures verify measures (None: report the figure, do not judge it)."""

    spec_acceptance_min: float | None = 0.3
    ttft_p99_max_s: float | None = None
    max_restarts: int = 0


def check_metrics(
    target: ApiTarget, summary: MetricsSummary, thresholds: Thresholds, spec_log: Mapping[str, Any] | None
) -> list[Check]:
    """Prefix-cache hits on the repeated prompt, speculative acceptance, TTFT P99 (over the verify window)."""
    where = _where(target, "/metrics")
    checks: list[Check] = []
    block = block_size_of(summary.cache_config)
    # vLLM says in /metrics whether prefix caching is on; hybrid (Mamba / Gated DeltaNet) models start with it
    # off unless asked (seen on the H200 with a Qwen3-Next-shaped model: enable_prefix_caching="False").
    in_effect = str(summary.cache_config.get("enable_prefix_caching", "")).lower()
    if target.prefix_caching and in_effect == "false":
        asked = target.prefix_caching_explicit
        checks.append(
            _mk(
                "prefix_cache_hits",
                not asked,
                "prefix caching on (--enable-prefix-caching)" if asked else "not measurable",
                "enable_prefix_caching=False",
                where,
                "vLLM runs without prefix caching (vllm:cache_config_info)"
                + (" although the command asks for it" if asked else ": its default for this model"),
            )
        )
    elif target.prefix_caching and block and target.max_model_len and target.max_model_len <= block:
        checks.append(
            _mk(
                "prefix_cache_hits",
                True,
                "not measurable",
                None,
                where,
                f"max_model_len {target.max_model_len} does not exceed one KV block ({block} tokens)",
            )
        )
    elif target.prefix_caching:
        hits = summary.prefix_cache_hits
        checks.append(
            _mk(
                "prefix_cache_hits",
                bool(hits and hits > 0),
                "> 0 hit tokens on a repeated prompt",
                hits,
                where,
                f"queries {summary.prefix_cache_queries}",
            )
        )
    if target.spec_decode and thresholds.spec_acceptance_min is not None:
        rate = summary.spec_acceptance_rate
        log_rate = None
        if spec_log and spec_log.get("avg_draft_acceptance_rate") is not None:
            log_rate = float(spec_log["avg_draft_acceptance_rate"]) / 100.0
        seen = rate if rate is not None else log_rate
        checks.append(
            _mk(
                "spec_decode_acceptance",
                seen is not None and seen >= thresholds.spec_acceptance_min,
                f">= {thresholds.spec_acceptance_min:.2f}",
                seen,
                where,
                f"metrics {rate}, log line {log_rate}",
            )
        )
    if target.kv_offload_cpu_bytes:
        checks.append(check_kv_offload_metrics(target, summary))
    ttft_ok = summary.ttft_count > 0
    if ttft_ok and thresholds.ttft_p99_max_s is not None:
        ttft_ok = summary.ttft_p99_s is not None and summary.ttft_p99_s <= thresholds.ttft_p99_max_s
    expected = (
        "observations" if thresholds.ttft_p99_max_s is None else f"P99 <= {thresholds.ttft_p99_max_s} s"
    )
    checks.append(
        _mk(
            "ttft_p99",
            ttft_ok,
            expected,
            summary.ttft_p99_s,
            where,
            f"P50 {summary.ttft_p50_s} s over {summary.ttft_count} requests",
        )
    )
    return checks


def check_kv_offload_metrics(target: ApiTarget, summary: MetricsSummary) -> Check:
    """The CPU KV tier the plan asked for is registered in /metrics (`vllm:kv_offload_*` families), and what
    it moved over the verify window (reported, not judged: a short window may store nothing)."""
    offload = summary.kv_offload
    planned = f"vllm:kv_offload_* present (CPU tier {target.kv_offload_cpu_bytes:,} B)"
    if not offload:
        backend = summary.cache_config.get("kv_offloading_backend")
        return _mk(
            "kv_offload_metrics",
            False,
            planned,
            None,
            _where(target, "/metrics"),
            "no vllm:kv_offload_* metric: the OffloadingConnector is not running"
            + (f" (cache_config_info kv_offloading_backend={backend})" if backend else ""),
        )
    return _mk(
        "kv_offload_metrics",
        True,
        planned,
        len(offload["families"]),
        _where(target, "/metrics"),
        f"{len(offload['families'])} families; stored {offload['store_bytes']} B, loaded "
        f"{offload['load_bytes']} B over the verify window",
    )


def rank_named(check: Check, node: Mapping[str, Any]) -> Check:
    """A failed check of one rank of a multi-host instance says which rank (and host) failed."""
    if check.ok:
        return check
    nodes = list(node.get("nodes") or [])
    rank = int(node.get("rank", 0))
    host = nodes[rank] if rank < len(nodes) else "?"
    where = f"rank {rank} of {len(nodes)} ({host}{', headless' if node.get('headless') else ', the API'})"
    return Check(check.name, False, check.expected, check.seen, check.line, f"{where}: {check.detail}")


def check_restarts(unit: UnitState, thresholds: Thresholds) -> Check:
    """Automatic restarts since the last deliberate start (systemd's NRestarts): a healthy unit has none."""
    return _mk(
        "restarts",
        unit.n_restarts <= thresholds.max_restarts and unit.active_state == "active",
        f"<= {thresholds.max_restarts} and active",
        f"{unit.n_restarts} ({unit.active_state}/{unit.sub_state})",
        "systemctl show -p NRestarts,ActiveState",
    )


# ------------------------------------------------------------------------------------------- the report


@dataclass
class InstanceReport:
    host: str
    instance: str
    unit: str
    ok: bool
    checks: list[Check]
    target: dict[str, Any] = field(default_factory=dict)
    unit_state: dict[str, Any] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    readiness: dict[str, Any] = field(default_factory=dict)
    # The start (InvocationID) and plan (digest) whose full checks, test requests included, passed last.
    verified_start: dict[str, str] = field(default_factory=dict)
    full: bool = True

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "host": self.host,
            "instance": self.instance,
            "unit": self.unit,
            "ok": self.ok,
            "checks": [check_to_dict(c) for c in self.checks],
            "target": self.target,
            "unit_state": self.unit_state,
            "readiness": self.readiness,
            "log": self.log,
            "metrics": self.metrics,
            "full": self.full,
            "verified_start": self.verified_start,
        }


def check_to_dict(check: Check) -> dict[str, Any]:
    return {
        "name": check.name,
        "ok": bool(check.ok),
        "expected": check.expected,
        "seen": check.seen,
        "line": check.line,
        "detail": check.detail,
    }


def _log_dict(report: Any) -> dict[str, Any]:
    to_dict = getattr(report, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


def log_expectations(expectations: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's expectations that the startup log can show, in `logcheck.check_log`'s keys.

    The plan also carries what the log cannot show (port, served name: the API checks use those), and
    `None` for what does not apply (custom all-reduce on one GPU). NUMA binding lines are expected only
    when vLLM binds its own workers (mode `vllm`); under a numactl wrapper vLLM logs no binding.
    """
    out = {k: v for k, v in expectations.items() if k in LOG_EXPECTATION_KEYS and v is not None}
    binding = expectations.get("numa_binding") or {}
    if "numa_nodes" not in out and binding.get("mode") == "vllm" and binding.get("nodes"):
        out["numa_nodes"] = sorted({int(n) for n in binding["nodes"]})
    return out


CAPACITY_CHECKS = ("kv_cache_tokens", "max_concurrency")


def approximate_capacity(checks: list[Check], expectations: Mapping[str, Any]) -> list[Check]:
    """The capacity checks of a plan whose formula no real log of the installed release reproduces
    (`kv_capacity_exact` False, plan.proven): a difference is a warning with both numbers, not a failure, so
    a healthy instance of an unproven release is never failed on the planner's guess (issue 34). A log that
    shows no figure at all still fails."""
    if expectations.get("kv_capacity_exact") is not False:
        return checks
    softened = []
    for check in checks:
        if check.name in CAPACITY_CHECKS and not check.ok and check.seen is not None:
            check = Check(
                check.name,
                True,
                check.expected,
                check.seen,
                check.line,
                f"warning: approximate plan (no real log of this vLLM release reproduces its formula): vLLM "
                f"shows {check.seen}, the plan expected {check.expected}; {check.detail}",
            )
        softened.append(check)
    return softened


def check_readiness(readiness: Mapping[str, Any]) -> list[Check]:
    """The wait's verdict as checks: ready, or why not, with the fatal line(s) it read from the journal."""
    state = str(readiness.get("state", ""))
    # timeout 0: the first poll decided (ready, or crashed), so no deadline was derived (vllm_fleet_wait)
    timeout = readiness.get("timeout")
    where = f"waited {readiness.get('waited_s')} s" + (f" of {timeout} s" if timeout else " (the first poll)")
    checks = [
        _mk(
            "readiness",
            state == "ready",
            "ready (/health 200)",
            f"{state}: {readiness.get('reason', '')}",
            where,
            str(readiness.get("msg", "")) if state != "ready" else "",
        )
    ]
    for error in readiness.get("errors") or []:
        checks.append(
            _mk(
                f"log_fatal_{error.get('kind')}",
                False,
                "no fatal error in this start's log",
                error.get("kind"),
                str(error.get("line", "")),
            )
        )
    return checks


def start_of(plan: InstancePlan, invocation_id: str | None) -> dict[str, str]:
    """What a passed full check vouches for: this start of the unit, running this plan."""
    if not invocation_id:
        return {}
    digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True, default=str).encode()).hexdigest()
    return {"invocation_id": str(invocation_id), "plan_sha256": digest}


def needs_full_checks(
    previous: Mapping[str, Any] | None, plan: InstancePlan, invocation_id: str | None
) -> bool:
    """True unless the last report passed, and its full checks passed at this same start of this same plan:
    an instance that was not restarted since then has nothing new for the test requests to show."""
    if not previous or not previous.get("ok"):
        return True
    vouched = previous.get("verified_start") or {}
    return not vouched or vouched != start_of(plan, invocation_id)


def build_report(
    *,
    host: str,
    plan: Mapping[str, Any] | InstancePlan,
    journal: str | None,
    unit_show: str | None,
    api: Mapping[str, Mapping[str, Any] | None],
    metrics_before: str | None,
    metrics_after: str | None,
    thresholds: Thresholds | None = None,
    readiness: Mapping[str, Any] | None = None,
    address: str | None = None,
    full: bool = True,
    verified_start: Mapping[str, str] | None = None,
) -> InstanceReport:
    """Every check of one instance: the startup log against the plan's expectations, the API, /metrics.

    `full=False` (`needs_full_checks` said the last report's full checks passed at this very start and plan,
    `verified_start` is what that report vouched for): the test requests were not sent again and their checks
    are left out; what a running instance can lose (health, the models, /metrics, the log since this start,
    restarts) is checked as always.

    When the wait says the instance never became ready, the report holds that verdict and the fatal lines
    only: checking a dead instance's API would only repeat the same failure many times.

    Without systemd (`vllm-fleet verify`): `unit_show=None` leaves out the restarts check, which only
    systemd's NRestarts can answer, and `journal=None` (no log given) the startup-log checks.
    """
    thresholds = thresholds or Thresholds()
    instance = plan if isinstance(plan, InstancePlan) else InstancePlan.from_dict(plan)
    target = api_target(instance, address=address)
    unit = parse_systemctl_show(unit_show, target.unit) if unit_show is not None else None
    readiness = dict(readiness or {})
    checks: list[Check] = check_readiness(readiness) if readiness else []
    log: dict[str, Any] = {}
    summary = MetricsSummary()

    # a headless rank of a multi-host instance has no API: its log (its workers in the planned world and
    # stages) and its unit are what it shows; the API of the instance is checked on rank 0
    headless = instance.headless
    if not readiness or readiness.get("state") == "ready":
        log_report = parse_log(journal_text(journal or "", unit.main_pid if unit else None))
        if journal is not None:
            log = _log_dict(log_report)
            # A healthy start logs its readiness and no fatal line, whatever else the plan expects.
            ready = {} if headless else {"ready": True}
            expectations = {**ready, "no_errors": True, **log_expectations(instance.expectations)}
            checks.extend(approximate_capacity(check_log(log_report, expectations), instance.expectations))
        if unit is not None:
            checks.append(check_restarts(unit, thresholds))
    if (not readiness or readiness.get("state") == "ready") and not headless:
        checks.append(check_health(target, api.get("health")))
        checks.extend(check_models(target, api.get("models")))
        if full:
            checks.append(
                check_completion(target, "api_completion", "/v1/completions", api.get("completion"))
            )
            checks.append(
                check_completion(target, "api_chat_completion", "/v1/chat/completions", api.get("chat"))
            )
        checks.append(check_metrics_endpoint(target, api.get("metrics")))
        if metrics_after:
            summary = summarize_metrics(metrics_after, metrics_before)
            spec_log = getattr(log_report, "spec_decode", None)
            spec = spec_log if isinstance(spec_log, Mapping) or spec_log is None else _log_dict(spec_log)
            if full:
                checks.extend(check_metrics(target, summary, thresholds, spec))
            elif target.kv_offload_cpu_bytes:
                checks.append(check_kv_offload_metrics(target, summary))

    if instance.node:
        checks = [rank_named(check, instance.node) for check in checks]
    kept = {k: readiness[k] for k in READINESS_KEPT if k in readiness}
    ok = bool(checks) and all(c.ok for c in checks)
    if full:
        verified = start_of(instance, kept.get("invocation_id")) if ok else {}
    else:
        verified = dict(verified_start or {}) if ok else {}
    return InstanceReport(
        host=host,
        instance=target.instance,
        unit=target.unit,
        ok=ok,
        full=full,
        verified_start=verified,
        checks=checks,
        target=target.to_dict(),
        unit_state=unit.to_dict() if unit else {},
        log=log,
        metrics=summary.to_dict(),
        readiness=kept,
    )


def failure_message(report: Mapping[str, Any] | InstanceReport) -> str:
    """One line per failed check: what was expected, what was seen, and where (log line or request)."""
    data = report.to_dict() if isinstance(report, InstanceReport) else report
    lines = [f"{data['host']}/{data['instance']} ({data['unit']}): verification failed"]
    for check in data["checks"]:
        if not check["ok"]:
            where = f" at: {check['line']}" if check.get("line") else ""
            detail = f" ({check['detail']})" if check.get("detail") else ""
            lines.append(
                f"  - {check['name']}: expected {check['expected']}, seen {check['seen']}{detail}{where}"
            )
    return "\n".join(lines)


def warning_lines(report: Mapping[str, Any] | InstanceReport) -> list[str]:
    """One line per passed check that carries a warning (`approximate_capacity`), for Ansible's warnings."""
    data = report.to_dict() if isinstance(report, InstanceReport) else report
    return [
        f"{data['host']}/{data['instance']}: {check['name']}: {check['detail']}"
        for check in data["checks"]
        if check["ok"] and str(check.get("detail") or "").startswith("warning:")
    ]


# ------------------------------------------------------------------------------------ saving and table


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", part) or "_"


def report_path(report_dir: str | os.PathLike[str], host: str, instance: str) -> Path:
    return Path(report_dir) / f"{_safe(host)}--{_safe(instance)}.json"


def save_report(report_dir: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Write `<dir>/<host>--<instance>.json` atomically, so a reader never sees half a file."""
    return write_json(report_path(report_dir, str(data["host"]), str(data["instance"])), data)


def load_report(report_dir: str | os.PathLike[str], host: str, instance: str) -> dict[str, Any] | None:
    """The instance's last report, or None when there is none or it cannot be read (then everything is
    checked again, which is always safe)."""
    try:
        data = json.loads(report_path(report_dir, host, instance).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_reports(report_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every `*.json` report of a folder, sorted by host then instance."""
    folder = Path(report_dir)
    if not folder.is_dir():
        raise FleetInputError(
            f"report folder {str(folder)!r} does not exist; run playbooks/verify.yml first "
            "or name the folder that vllm_verify_report_dir points to"
        )
    reports = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise FleetInputError(
                f"report {str(path)!r} is not JSON ({exc}); delete it and verify again"
            ) from exc
        if not isinstance(data, dict) or "checks" not in data or "host" not in data:
            raise FleetInputError(f"report {str(path)!r} is not a vllm-fleet verify report (no host/checks)")
        reports.append(data)
    return sorted(reports, key=lambda r: (str(r["host"]), str(r["instance"])))


LIGHT = "light"
LIGHT_NOTE = (
    "light: a re-run found the same start of the same plan its full checks passed at, so it sent no test "
    "requests (no TTFT, prefix hit or acceptance to show); -e vllm_verify_full=true measures them again"
)


def _is_light(report: Mapping[str, Any]) -> bool:
    return report.get("full") is False


TABLE_COLUMNS = (
    "host",
    "instance",
    "result",
    "kv tokens",
    "conc.",
    "kv dtype",
    "ttft p50/p99 ms",
    "prefix hit",
    "spec acc.",
    "restarts",
    "failed checks",
)


def table_rows(reports: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for data in reports:
        log = data.get("log") or {}
        metrics = data.get("metrics") or {}
        failed = [c["name"] for c in data.get("checks", []) if not c.get("ok")]
        ttft = f"{fmt(metrics.get('ttft_p50_s'), 1000)}/{fmt(metrics.get('ttft_p99_s'), 1000)}"
        measured = [
            ttft,
            fmt(metrics.get("prefix_cache_hit_rate"), 100, 1, "%"),
            fmt(metrics.get("spec_acceptance_rate"), 100, 1, "%"),
        ]
        if _is_light(data):
            measured = [LIGHT] * len(measured)  # no test requests were sent to measure them
        restarts = (data.get("unit_state") or {}).get("n_restarts")
        rows.append(
            [
                str(data.get("host")),
                str(data.get("instance")),
                "OK" if data.get("ok") else "FAIL",
                fmt(log.get("kv_cache_tokens")),
                fmt(log.get("max_concurrency"), digits=2, suffix="x"),
                fmt(log.get("kv_cache_dtype")),
                *measured,
                fmt(restarts),
                ", ".join(failed) or "-",
            ]
        )
    return rows


def fleet_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table, one row per host and instance, with a summary line."""
    lines = text_table(TABLE_COLUMNS, table_rows(reports))
    passed = sum(1 for r in reports if r.get("ok"))
    lines.append(f"{passed}/{len(reports)} instances passed")
    if any(_is_light(r) for r in reports):
        lines.append(LIGHT_NOTE)
    return "\n".join(lines)


def fleet_summary(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON twin of the table (`vllm-fleet report --json`)."""
    return {
        "instances": len(reports),
        "passed": sum(1 for r in reports if r.get("ok")),
        "failed": [
            {
                "host": r["host"],
                "instance": r["instance"],
                "checks": [c["name"] for c in r.get("checks", []) if not c.get("ok")],
            }
            for r in reports
            if not r.get("ok")
        ],
        "rows": [dict(zip(TABLE_COLUMNS, row, strict=True)) for row in table_rows(reports)],
    }


def verify_stats(host: str, results: list[Mapping[str, Any]] | None, report_dir: str) -> dict[str, Any]:
    """One host's verdict as `set_stats` data (AWX keeps it as the job's artifacts): `{host: {verdict,
    instances, report_dir}}`; passed when every verified instance is ok (none verified: nothing failed)."""
    instances = list(results or [])
    verdict = "failed" if [r for r in instances if not r.get("ok")] else "passed"
    return {host: {"verdict": verdict, "instances": instances, "report_dir": report_dir}}
