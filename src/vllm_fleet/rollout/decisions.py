"""Fleet rollouts: the batch plan, last-known-good bookkeeping, the stop rule and the summary.

`playbooks/rollout.yml` does the work on the hosts; this module holds every decision it needs, as pure
functions over plain data, so the playbook (through the thin filters of `roles/vllm_rollout`), the CLI
(`vllm-fleet rollout`) and the tests share one definition of each rule:

- `parse_serial` / `plan_batches`: how `serial` splits the hosts, exactly as Ansible's own
  `PlaybookExecutor._get_serialized_batches` does it (percentages of the play's hosts, the last size repeats);
- `argv_hash` / `config_fingerprint`: what "the same configuration" means (old → new per host, and the name
  of a last-known-good snapshot, so re-running a finished rollout writes nothing);
- `history_to_prune`: which snapshots go when more than `keep` exist (never the one a rollback may need);
- `batch_verdict`: whether a batch's failures stop the rollout (`max_fail_percentage`, canary);
- `summarize`: the per-host and fleet summary that the playbook writes as JSON and the CLI prints;
- `digest_events`: what ansible-runner's event stream says about each host (unreachable, failed task).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import InstancePlan

# Task names of roles/vllm_rollout that mark a step of a host's turn (the CLI prints them as progress).
STEP_PREFIX = "Rollout step - "
SERIAL_VAR = "vllm_rollout_serial"
MAX_FAIL_VAR = "vllm_rollout_max_fail_percentage"

# A host's result, from best to worst. `unchanged`: its configuration was already the target one (nothing
# restarted); `rolled_back`: the new configuration failed and the last-known-good one serves again;
# `down`: the rollback failed too (or there was nothing to roll back to); `unreachable`: no connection
# (before or during its turn); `in_progress`: it started and no result came back (the run was interrupted);
# `not_started`: the rollout stopped before its batch; `refused`: preflight rejected it, nothing changed.
STATUSES = ("ok", "unchanged", "rolled_back", "down", "unreachable", "in_progress", "not_started", "refused")
SUCCESS = frozenset({"ok", "unchanged"})
FAILED = frozenset({"rolled_back", "down", "unreachable", "in_progress"})


# ---------------------------------------------------------------------------------------------------- batches


def parse_serial(value: Any) -> list[int | str]:
    """Read `vllm_rollout_serial`: an int, a percentage string ("25%"), or a list of them.

    A comma-separated string ("1,25%,100%", as the CLI takes it) is split. Raises FleetInputError naming the
    variable, the value and the fix.
    """
    if isinstance(value, str) and "," in value:
        items: list[Any] = [part.strip() for part in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    if not items:
        raise FleetInputError(
            f"{SERIAL_VAR}=[] is empty: give a batch size such as 1, '25%' or [1, '25%', '100%']"
        )
    parsed: list[int | str] = []
    for item in items:
        parsed.append(_parse_serial_item(item, value))
    return parsed


def _parse_serial_item(item: Any, whole: Any) -> int | str:
    fix = "use a positive integer or a percentage from 1% to 100%, e.g. [1, '25%', '100%']"
    if isinstance(item, bool):
        raise FleetInputError(f"{SERIAL_VAR}={whole!r}: {item!r} is not a batch size; {fix}")
    if isinstance(item, int):
        if item < 1:
            raise FleetInputError(f"{SERIAL_VAR}={whole!r}: {item} is not a batch size; {fix}")
        return item
    text = str(item).strip()
    if text.endswith("%"):
        number = text[:-1].strip()
        if number.isdigit() and 1 <= int(number) <= 100:
            return f"{int(number)}%"
    elif text.isdigit() and int(text) >= 1:
        return int(text)
    raise FleetInputError(f"{SERIAL_VAR}={whole!r}: {item!r} is not a batch size; {fix}")


def batch_size(item: int | str, total: int) -> int:
    """One `serial` entry as a number of hosts, rounding like Ansible's `pct_to_int` (down, at least 1)."""
    if isinstance(item, str):
        return int(int(item[:-1]) / 100.0 * total) or 1
    return item


def plan_batches(hosts: Sequence[str], serial: Any) -> list[list[str]]:
    """Split `hosts` (in play order) into the batches Ansible runs for `serial`."""
    sizes = parse_serial(serial)
    remaining = list(hosts)
    total = len(remaining)
    batches: list[list[str]] = []
    index = 0
    while remaining:
        size = batch_size(sizes[min(index, len(sizes) - 1)], total)
        batches.append(remaining[:size])
        remaining = remaining[size:]
        index += 1
    return batches


def instance_groups(plans: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """{host: the hosts of its multi-host instance, rank order} from the hosts' plans (`HostPlan.to_dict()`,
    preflight's vllm_fleet_plan); hosts of single-host instances are left out."""
    groups: dict[str, tuple[str, ...]] = {}
    for host, plan in plans.items():
        for instance in (plan or {}).get("instances") or []:
            nodes = tuple((instance.get("node") or {}).get("nodes") or ())
            if nodes:
                groups[host] = nodes
    return groups


def failed_peers(
    host: str, groups: Mapping[str, Sequence[str]], failures: Mapping[str, Any], batch: Iterable[str]
) -> list[str]:
    """The other hosts of `host`'s multi-host instance (`instance_groups`) whose turn failed in this batch
    (`failures`: host -> its failure, None when it passed). Its ranks run one world: when one rank is rolled
    back, its peers are too, else the restored rank waits for ranks that still run the new configuration
    (seen on two lab hosts: rank 1's own verify passed, rank 0's rolled back alone and never became ready).
    Only the hosts of `batch` count: a failure fact left from an earlier batch is not this one's."""
    in_batch = set(batch)
    return [p for p in groups.get(host) or () if p != host and p in in_batch and failures.get(p)]


def group_batch_errors(
    batches: Sequence[Sequence[str]], groups: Mapping[str, Sequence[str]], targets: Sequence[str]
) -> list[str]:
    """A multi-host instance is rolled out as one unit: all its hosts in the rollout and in one batch (the
    canary counts as one), else its ranks would run two releases or plans at once and never meet."""
    errors: list[str] = []
    batch_of = {host: n for n, batch in enumerate(batches) for host in batch}
    for nodes in dict.fromkeys(tuple(g) for g in groups.values()):
        missing = [h for h in nodes if h not in targets]
        if missing:
            errors.append(
                f"vllm_rollout_hosts: {', '.join(missing)} of the instance over {', '.join(nodes)} not in "
                "the rollout; roll out every host of a multi-host instance together (name its group)"
            )
            continue
        seen = sorted({batch_of[h] for h in nodes if h in batch_of})
        if len(seen) > 1:
            split = "; ".join(
                f"{'canary' if n == 0 else f'batch {n}'}: "
                f"{', '.join(h for h in nodes if batch_of.get(h) == n)}"
                for n in seen
            )
            errors.append(
                f"vllm_rollout_serial / vllm_rollout_canary: the instance over {', '.join(nodes)} would be "
                f"split across batches ({split}); its ranks restart together: name all its hosts as the "
                "canary, or give batch sizes that keep them in one batch"
            )
    return errors


def split_canary(hosts: Sequence[str], canary: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The canary hosts (the named ones, or else the first host) and the rest, both in play order.

    Raises FleetInputError when a named canary is not among the hosts being rolled out.
    """
    if not hosts:
        raise FleetInputError(
            "vllm_rollout_hosts matches no host in the inventory; name a group or host pattern that exists"
        )
    if not canary:
        return [hosts[0]], list(hosts[1:])
    unknown = [name for name in canary if name not in hosts]
    if unknown:
        raise FleetInputError(
            f"vllm_rollout_canary names {', '.join(unknown)}, which vllm_rollout_hosts does not include "
            f"({', '.join(hosts)}); name hosts (or a group) from the rollout"
        )
    chosen = set(canary)
    return [h for h in hosts if h in chosen], [h for h in hosts if h not in chosen]


def check_max_fail_percentage(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise FleetInputError(
            f"{MAX_FAIL_VAR}={value!r} is not a percentage; use an integer from 0 "
            "(stop at the first failure) to 100"
        )
    number = int(str(value).strip())
    if number > 100:
        raise FleetInputError(f"{MAX_FAIL_VAR}={number} is above 100; use an integer from 0 to 100")
    return number


def batch_verdict(
    statuses: Mapping[str, str], max_fail_percentage: Any, *, canary: bool = False
) -> dict[str, Any]:
    """Whether a finished batch stops the rollout.

    `statuses`: host → status for every host of the batch. A canary stops on any failure; otherwise the
    rollout stops when failed / batch size exceeds `max_fail_percentage` (Ansible's rule, except that an
    unreachable host counts as failed here). A host that was rolled back always stops the rollout: its new
    configuration is known bad, so the other hosts must not get it.
    """
    limit = check_max_fail_percentage(max_fail_percentage)
    failed = sorted(h for h, s in statuses.items() if s not in SUCCESS)
    rolled_back = sorted(h for h, s in statuses.items() if s in ("rolled_back", "down"))
    size = max(len(statuses), 1)
    reason = ""
    if failed and canary:
        reason = f"canary failed: {', '.join(failed)}"
    elif rolled_back:
        reason = f"new configuration failed verification on {', '.join(rolled_back)}"
    elif failed and len(failed) / size > limit / 100.0:
        reason = (
            f"{len(failed)} of {len(statuses)} hosts failed ({', '.join(failed)}), above "
            f"{MAX_FAIL_VAR}={limit}"
        )
    return {"stop": bool(reason), "reason": reason, "failed": failed}


def batch_statuses(records: Iterable[Mapping[str, Any]], batch: Sequence[str]) -> dict[str, str]:
    """Host → status for the hosts of a batch, from their records. A host without a record, or still
    `in_progress` (it became unreachable or its turn was cut short), has no result: it counts as failed."""
    latest = {str(r.get("host")): str(r.get("status")) for r in records}
    return {host: latest.get(host, "in_progress") for host in batch}


def batch_verdict_from_records(
    records: Iterable[Mapping[str, Any]],
    batch: Sequence[str],
    max_fail_percentage: Any,
    *,
    canary: bool = False,
) -> dict[str, Any]:
    return batch_verdict(batch_statuses(records, batch), max_fail_percentage, canary=canary)


# ------------------------------------------------------------------------------------- hashes and history


def argv_hash(argv: Sequence[str] | None) -> str | None:
    """A short stable name for a serve command: sha256 over the NUL-joined argv, 12 hex digits."""
    if not argv:
        return None
    digest = hashlib.sha256("\0".join(str(a) for a in argv).encode("utf-8")).hexdigest()
    return digest[:12]


def config_fingerprint(checksums: Mapping[str, str]) -> str | None:
    """Name of a host's whole vLLM configuration (units, env files, plans): sha256 over the sorted
    (file name, content checksum) pairs, 16 hex digits. None when there are no files (nothing deployed)."""
    if not checksums:
        return None
    text = "\n".join(f"{name}\0{checksums[name]}" for name in sorted(checksums))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def snapshot_dir_name(fingerprint: str) -> str:
    return f"cfg-{fingerprint}"


def history_to_prune(
    entries: Sequence[Mapping[str, Any]], keep: int, protect: Iterable[str] = ()
) -> list[str]:
    """Snapshot folders to delete so that at most `keep` remain, oldest first out.

    `entries`: `{"path": ..., "mtime": ...}` as `ansible.builtin.find` reports folders. Paths ending in a
    protected name (the snapshot a rollback of this run needs, the one just verified) are never deleted.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise FleetInputError(
            f"vllm_rollout_history_keep={keep!r} is not a count; keep at least 1 snapshot (the default is 5)"
        )
    protected = {p for p in protect if p}
    ordered = sorted(entries, key=lambda e: (float(e.get("mtime", 0)), str(e["path"])), reverse=True)
    kept = [e for e in ordered if _basename(e["path"]) in protected]
    doomed: list[str] = []
    for entry in ordered:
        if entry in kept:
            continue
        if len(kept) < keep:
            kept.append(entry)
        else:
            doomed.append(str(entry["path"]))
    return sorted(doomed)


def _basename(path: Any) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def instance_names(file_names: Iterable[str], unit_prefix: str = "vllm-fleet-") -> list[str]:
    """The instances whose units a configuration holds (`vllm-fleet-i0.service` → `i0`)."""
    names = set()
    for name in file_names:
        base = _basename(name)
        if base.startswith(unit_prefix) and base.endswith(".service"):
            names.add(base[len(unit_prefix) : -len(".service")])
    return sorted(names)


def restore_order(plans: Iterable[Mapping[str, Any] | str], instances: Sequence[str]) -> dict[str, list[str]]:
    """The restored `instances` in the order a deploy (re)starts them (roles/vllm_service/tasks/apply.yml),
    from the restored `<instance>.json` plans: `stop_first`, rank 0 of each instance over several hosts, stops
    before its other ranks start (a rank > 0 started while the failed rank 0 still runs would join the failed
    world); `headless`, the ranks > 0, (re)start next; `then`, every instance but those, rank 0 included.
    An instance without a readable plan counts as one of a single host."""
    parsed = {plan.name: plan for plan in map(_instance_plan, plans) if plan}
    headless = [name for name in instances if name in parsed and parsed[name].headless]
    rank0 = [name for name in instances if name in parsed and parsed[name].node and name not in headless]
    return {"stop_first": rank0, "headless": headless, "then": [n for n in instances if n not in headless]}


def plan_identity(plans: Iterable[Mapping[str, Any] | str]) -> dict[str, Any]:
    """What a host serves, from its `<instance>.json` plans: vLLM version and the argv hash per instance.

    Plans may arrive as JSON text (slurped files) or dicts. What is not an instance plan of this schema (an
    older vllm-fleet's file, a foreign JSON) counts as unknown, never an error: the summary must still be
    written for such a host, and its next deploy rewrites the file.
    """
    instances: dict[str, str | None] = {}
    versions: set[str] = set()
    for raw in plans:
        plan = _instance_plan(raw)
        if plan is None:
            continue
        instances[plan.name] = argv_hash(plan.argv)
        versions.add(plan.vllm_version)
    combined = argv_hash([f"{k}={v}" for k, v in sorted(instances.items())]) if instances else None
    return {
        "version": ",".join(sorted(versions)) or None,
        "argv_hash": combined,
        "instances": instances,
    }


def _instance_plan(raw: Mapping[str, Any] | str) -> InstancePlan | None:
    if not isinstance(raw, Mapping):
        try:
            raw = json.loads(raw)
        except (TypeError, ValueError):
            return None
    try:
        return InstancePlan.from_dict(raw)
    except FleetInputError:
        return None


# ---------------------------------------------------------------------------------------------- summary


@dataclass
class HostRecord:
    """One host's part of a rollout, as the playbook records it on the controller."""

    host: str
    status: str = "not_started"
    canary: bool = False
    batch: int | None = None
    old: dict[str, Any] = field(default_factory=dict)
    new: dict[str, Any] = field(default_factory=dict)
    time_to_ready_s: float | None = None
    failure: str | None = None
    rollback_failure: str | None = None
    snapshot: str | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        record = cls(**known)
        if record.status not in STATUSES:
            raise FleetInputError(
                f"rollout record for {record.host!r} has status {record.status!r}; expected one of "
                f"{', '.join(STATUSES)} (a record from another vllm-fleet version?)"
            )
        return record

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def host_result(
    *,
    host: str,
    canary: bool,
    batch: int | None,
    old_plans: Iterable[Mapping[str, Any] | str],
    new_plans: Iterable[Mapping[str, Any] | str],
    old_fingerprint: str | None,
    new_fingerprint: str | None,
    started_at: float,
    ready_at: float | None,
    failure: str | None = None,
    rolled_back: bool | None = None,
    rollback_failure: str | None = None,
    unreachable: bool = False,
    snapshot: str | None = None,
) -> dict[str, Any]:
    """The record of one host's turn, from what the playbook saw (called by the `vllm_rollout_record` filter).

    Status: `unreachable` when the connection failed; `ok` / `unchanged` when verification passed (unchanged:
    the configuration fingerprint did not move, so nothing restarted); `rolled_back` when it failed and the
    last-known-good configuration passed verification again; `down` when that failed too or there was none.
    """
    if unreachable:
        status = "unreachable"
    elif failure is None:
        status = "unchanged" if old_fingerprint == new_fingerprint else "ok"
    elif rolled_back:
        status = "rolled_back"
    else:
        status = "down"
    time_to_ready = None
    if status == "ok" and ready_at is not None:
        time_to_ready = round(max(ready_at - started_at, 0.0), 1)
    return HostRecord(
        host=host,
        status=status,
        canary=canary,
        batch=batch,
        old={**plan_identity(old_plans), "fingerprint": old_fingerprint},
        new={**plan_identity(new_plans), "fingerprint": new_fingerprint},
        time_to_ready_s=time_to_ready,
        failure=failure,
        rollback_failure=rollback_failure,
        snapshot=snapshot,
        started_at=started_at,
        finished_at=ready_at,
    ).to_dict()


def summarize(
    targets: Sequence[str],
    records: Iterable[Mapping[str, Any]],
    *,
    unreachable: Iterable[str] = (),
    refused: Mapping[str, str] | None = None,
    stop_reason: str | None = None,
    started_at: float | None = None,
    finished_at: float | None = None,
    finished: bool = True,
) -> dict[str, Any]:
    """The fleet summary: one entry per target host (in rollout order) and totals.

    `records`: the host records written so far (a later record of a host replaces an earlier one).
    `unreachable`: hosts ansible reported unreachable (the runner's events): a host that started and left no
    result is unreachable when listed here, `in_progress` otherwise. `refused`: host → reason when preflight
    stopped the rollout before any change. `finished`: False while the rollout runs (in-progress hosts are
    then simply in progress).
    """
    by_host: dict[str, HostRecord] = {}
    for raw in records:
        record = HostRecord.from_dict(raw)
        by_host[record.host] = record
    lost = set(unreachable)
    hosts: list[dict[str, Any]] = []
    for name in targets:
        record = by_host.get(name) or HostRecord(host=name)
        if refused is not None:
            record.status = "refused"
            record.failure = refused.get(name) or record.failure
        elif record.status == "in_progress" and name in lost:
            record.status = "unreachable"
            record.failure = record.failure or "host became unreachable during its turn"
        elif record.status == "not_started" and name in lost:
            record.status = "unreachable"
        hosts.append(record.to_dict())
    counts = {status: sum(1 for h in hosts if h["status"] == status) for status in STATUSES}
    failed = [h["host"] for h in hosts if h["status"] in FAILED or h["status"] == "refused"]
    incomplete = refused is not None or bool(failed) or counts["not_started"] > 0
    if refused is not None:
        result = "refused"
    elif not finished:
        result = "running"
    elif incomplete:
        result = "failed"
    elif counts["ok"] == 0:
        result = "unchanged"
    else:
        result = "ok"
    ready_times = [h["time_to_ready_s"] for h in hosts if h["time_to_ready_s"] is not None]
    if not stop_reason and refused is not None:
        stop_reason = "preflight refused " + ", ".join(sorted(h for h in refused if h in targets))
    if not stop_reason and failed and finished:
        stop_reason = f"failed hosts: {', '.join(failed)}"
    wall = None
    if started_at is not None and finished_at is not None:
        wall = round(max(finished_at - started_at, 0.0), 1)
    return {
        "result": result,
        "stop_reason": stop_reason,
        "hosts": hosts,
        "totals": {
            "hosts": len(hosts),
            **counts,
            "time_to_ready_max_s": max(ready_times) if ready_times else None,
            "time_to_ready_mean_s": round(sum(ready_times) / len(ready_times), 1) if ready_times else None,
            "wall_s": wall,
        },
        "started_at": started_at,
        "finished_at": finished_at,
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as a table for people (the CLI's default output)."""
    rows = [("host", "result", "old version/argv", "new version/argv", "ready in", "detail")]
    for host in summary["hosts"]:
        detail = host.get("failure") or ""
        if host.get("rollback_failure"):
            detail += f"; rollback: {host['rollback_failure']}"
        rows.append(
            (
                host["host"] + (" (canary)" if host.get("canary") else ""),
                host["status"],
                _identity(host.get("old")),
                _identity(host.get("new")),
                "-" if host.get("time_to_ready_s") is None else f"{host['time_to_ready_s']:.1f}s",
                _one_line(detail, 100),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1] for row in rows
    ]
    totals = summary["totals"]
    parts = [f"{totals[s]} {s}" for s in STATUSES if totals.get(s)]
    wall = "" if totals.get("wall_s") is None else f" in {totals['wall_s']:.1f}s"
    lines.append("")
    lines.append(f"rollout {summary['result']}{wall}: " + ", ".join(parts))
    if summary.get("stop_reason"):
        lines.append(f"stopped: {summary['stop_reason']}")
    return "\n".join(line.rstrip() for line in lines)


def _identity(side: Mapping[str, Any] | None) -> str:
    if not side or not (side.get("version") or side.get("argv_hash")):
        return "-"
    return f"{side.get('version') or '?'}/{side.get('argv_hash') or '?'}"


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# ------------------------------------------------------------------------------------ ansible-runner events


@dataclass
class EventDigest:
    """What the runner's event stream said: per host, the last task, failures, unreachable; plays seen."""

    plays: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)
    last_task: dict[str, str] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _event_message(data: Mapping[str, Any]) -> str:
    res = data.get("res") or {}
    if not isinstance(res, Mapping):
        return str(res)
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or ""
    return _one_line(str(msg), 300)


def digest_events(events: Iterable[Mapping[str, Any]]) -> EventDigest:
    """Fold ansible-runner events (the `event`/`event_data` dicts of its job events) into an EventDigest.

    Ignored failures (`ignore_errors`) do not count; a failure later rescued still appears under `failed`
    (the host record says whether it was rolled back).
    """
    digest = EventDigest()
    for event in events:
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host") or data.get("remote_addr")
        if kind == "playbook_on_play_start":
            digest.plays.append(str(data.get("play") or data.get("name") or ""))
        elif kind == "runner_on_start" and host:
            digest.last_task[host] = str(data.get("task") or "")
        elif kind == "runner_on_unreachable" and host:
            digest.unreachable[host] = _event_message(data) or "unreachable"
        elif kind == "runner_on_failed" and host and not data.get("ignore_errors"):
            digest.failed.setdefault(host, []).append(f"{data.get('task')}: {_event_message(data)}")
        elif kind == "playbook_on_stats":
            for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"):
                for name, count in (data.get(key) or {}).items():
                    digest.stats.setdefault(name, {})[key] = int(count)
    return digest


def progress_line(event: Mapping[str, Any]) -> str | None:
    """One line of progress for people, or None for events not worth a line."""
    kind = event.get("event")
    data = event.get("event_data") or {}
    host = data.get("host") or ""
    task = str(data.get("task") or "")
    if kind == "playbook_on_play_start":
        return f"== {data.get('play') or data.get('name')}"
    if kind == "runner_on_unreachable":
        return f"   {host}: UNREACHABLE during '{task}': {_event_message(data)}"
    if kind == "runner_on_failed" and not data.get("ignore_errors"):
        return f"   {host}: FAILED '{task}': {_event_message(data)}"
    if kind == "runner_on_ok" and task.startswith(STEP_PREFIX):
        return f"   {host}: {task[len(STEP_PREFIX) :].strip()}"
    if kind == "runner_on_ok" and task == "Say why the rollout stops":
        res = data.get("res") or {}
        return f"   {res.get('msg', 'rollout stops')}" if isinstance(res, Mapping) else None
    return None


def changed_total(digest: EventDigest, hosts: Iterable[str]) -> int:
    """Tasks reported changed on the given (managed) hosts: 0 on an idempotent re-run."""
    return sum(digest.stats.get(h, {}).get("changed", 0) for h in hosts)
