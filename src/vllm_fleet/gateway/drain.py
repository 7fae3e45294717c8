"""Draining one instance at the gateway before it restarts, and putting it back: HAProxy's runtime API.

    drain_target(plan, set, host_address, gateway_host) -> Target  the backend, server and /metrics URL
    drain_argv(python, socket, target) -> argv                     drain it, unless that leaves none serving
    parse_drain(stdout) -> Drain                                   what the drain script did
    read_argv(python, socket, commands, metrics_url) -> argv       one read on the gateway host
    server_row(show_stat, target) -> StatRow | None                that server's row of `show stat`
    servers_not_up(read_stdout) -> list[str]                       the gateway's servers not (yet) UP
    drain_verdict(row, read, waited_s, timeout_s) -> Verdict       waiting, drained or timeout

The drain is done when the gateway shows no session to the server (scur 0) AND vLLM's own gauges
`vllm:num_requests_running` + `vllm:num_requests_waiting` are 0: HAProxy's sessions end when a response ends,
but vLLM may still hold requests another client sent it directly. The gauges are read before SIGTERM, while
the API server still answers /metrics reliably (during vLLM's own drain /metrics failed 5 polls of 6, shared
research fleet-serving §2.2). A drain that times out is reported and the restart goes on: `--shutdown-timeout`
lets vLLM finish what is left (the second line of defence).

The drain itself keeps the fleet serving: a server is drained only while another server that takes its
requests is UP (one of its own set, or of a larger set, to which the frontend sends a set's requests while
the set has none: vllm_fleet.gateway.haproxy). Hosts restarted in parallel (site.yml, deploy.yml) would
otherwise all leave the gateway at once and every request get a 503. The check and the drain run under one
lock on the gateway host, so two hosts asking at the same moment are answered one after the other: the second
waits until the first is back. A fleet of one server has no other to wait for: it is drained (its restart
refuses new requests for a while; --shutdown-timeout finishes those in flight).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.gateway.sets import Server, check_set_name, server_of
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify.metrics import metric_total, parse_prometheus

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# What the runtime API answers when the gateway has no such server (a stale config, or a host outside it).
UNKNOWN_SERVER = ("No such server", "No such backend")

# The runtime API from the gateway host's own python3 (the library is not installed there): one command per
# connection (HAProxy's non-interactive mode), its whole answer. The start of both scripts below.
_ASK = (
    "import csv, fcntl, io, json, os, socket, sys, urllib.request\n"
    "def ask(path, command):\n"
    "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "    s.settimeout(10)\n"
    "    s.connect(path)\n"
    "    s.sendall(command.encode() + b'\\n')\n"
    "    chunks = []\n"
    "    while True:\n"
    "        chunk = s.recv(65536)\n"
    "        if not chunk:\n"
    "            break\n"
    "        chunks.append(chunk)\n"
    "    s.close()\n"
    "    return b''.join(chunks).decode(errors='replace')\n"
)

# Runs on the gateway host: the runtime API commands, then the instance's /metrics. Prints one JSON object.
READ_SCRIPT = _ASK + (
    "path, url, commands = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
    "out = {'replies': [], 'metrics': None, 'metrics_error': '', 'no_socket': not os.path.exists(path)}\n"
    "for command in commands if not out['no_socket'] else []:\n"
    "    out['replies'].append(ask(path, command))\n"
    "if url:\n"
    "    try:\n"
    "        out['metrics'] = urllib.request.urlopen(url, timeout=5).read().decode(errors='replace')\n"
    "    except Exception as exc:\n"
    "        out['metrics_error'] = f'{type(exc).__name__}: {exc}'\n"
    "print(json.dumps(out))\n"
)


# Runs on the gateway host under an exclusive lock beside the runtime socket: reads `show stat`, and drains
# backend/server only if a server of that backend or of a later one (a larger set: backends come in the
# config's order, smallest set first) other than it is UP, or if no other server exists at all. Prints one
# JSON object: drained (bool), reply (the drain command's answer), others ({backend/server: status}).
DRAIN_SCRIPT = _ASK + (
    "path, backend, server = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "if not os.path.exists(path):\n"
    "    print(json.dumps({'no_socket': True}))\n"
    "    sys.exit(0)\n"
    "with open(path + '.vllm-fleet-drain.lock', 'a') as lock:\n"
    "    fcntl.flock(lock, fcntl.LOCK_EX)\n"
    "    stat = ask(path, 'show stat').lstrip()\n"
    "    rows = [r for r in csv.DictReader(io.StringIO(stat[2:]))\n"
    "            if r.get('svname') not in ('FRONTEND', 'BACKEND')]\n"
    "    order = list(dict.fromkeys(r['pxname'] for r in rows))\n"
    "    later = order[order.index(backend):] if backend in order else [backend]\n"
    "    others = {r['pxname'] + '/' + r['svname']: r['status'] for r in rows\n"
    "              if r['pxname'] in later and (r['pxname'], r['svname']) != (backend, server)}\n"
    "    serving = [name for name, status in others.items() if status.startswith('UP')]\n"
    "    if others and not serving:\n"
    "        print(json.dumps({'drained': False, 'reply': '', 'others': others}))\n"
    "        sys.exit(0)\n"
    "    reply = ask(path, 'set server ' + backend + '/' + server + ' state drain')\n"
    "    print(json.dumps({'drained': True, 'reply': reply, 'others': others}))\n"
)


@dataclass(frozen=True)
class Target:
    backend: str
    server: str
    metrics_url: str

    def command(self, state: str) -> str:
        if state not in ("drain", "ready", "maint"):
            raise FleetInputError(f"gateway server state {state!r}: give drain, ready or maint")
        return f"set server {self.backend}/{self.server} state {state}"


def drain_target(
    plan: InstancePlan, instance_set: str, host_address: str, gateway_host: str | None = None
) -> Target:
    """The gateway's backend and server for one instance (named as vllm_fleet.gateway.haproxy names them)."""
    server: Server = server_of(plan, host_address, gateway_host)
    name = check_set_name(instance_set, plan.host)
    return Target(backend=f"set_{name}", server=server.name, metrics_url=f"http://{server.address}/metrics")


def drain_argv(python: str, socket_path: str, target: Target) -> list[str]:
    return [python, "-c", DRAIN_SCRIPT, socket_path, target.backend, target.server]


@dataclass(frozen=True)
class Drain:
    drained: bool  # the drain command was sent (its reply says whether HAProxy took it)
    reply: str
    others: dict[str, str]  # the servers that could take its requests: backend/server -> status
    no_socket: bool = False


def parse_drain(stdout: str) -> Drain:
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        return Drain(
            bool(data.get("drained")),
            str(data.get("reply") or ""),
            {str(k): str(v) for k, v in (data.get("others") or {}).items()},
            bool(data.get("no_socket")),
        )
    except (IndexError, ValueError, KeyError, TypeError, AttributeError) as exc:
        shown = stdout[-300:]
        raise FleetInputError(f"gateway drain: not the drain script's JSON ({exc}): {shown!r}") from exc


def read_argv(python: str, socket_path: str, commands: list[str], metrics_url: str = "") -> list[str]:
    return [python, "-c", READ_SCRIPT, socket_path, metrics_url, *commands]


@dataclass(frozen=True)
class Read:
    replies: list[str]
    metrics: str | None
    metrics_error: str
    no_socket: bool = False  # no HAProxy there yet (the first deploy comes before the gateway's)


def parse_read(stdout: str) -> Read:
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        return Read(
            list(data["replies"]),
            data.get("metrics"),
            str(data.get("metrics_error") or ""),
            bool(data.get("no_socket")),
        )
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise FleetInputError(f"gateway read: not the read script's JSON ({exc}): {stdout[-300:]!r}") from exc


@dataclass(frozen=True)
class StatRow:
    backend: str
    server: str
    status: str  # UP, DOWN, DRAIN, MAINT, "UP 1/2" while a check moves it...
    scur: int  # sessions now
    stot: int  # sessions since start (the per-server counter of requests it was sent)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stat_rows(show_stat: str) -> list[StatRow]:
    """Every server row of `show stat` (CSV, its header line starts with '# ')."""
    text = show_stat.lstrip()
    if not text.startswith("# pxname"):
        raise FleetInputError(f"gateway: `show stat` answered {show_stat[:200]!r}, not its CSV")
    reader = csv.DictReader(io.StringIO(text[2:]))
    rows = []
    for record in reader:
        if record.get("svname") in ("FRONTEND", "BACKEND", None):
            continue
        rows.append(
            StatRow(
                backend=record["# pxname"] if "# pxname" in record else record["pxname"],
                server=record["svname"],
                status=record.get("status") or "",
                scur=int(record.get("scur") or 0),
                stot=int(record.get("stot") or 0),
            )
        )
    return rows


def server_row(show_stat: str, target: Target) -> StatRow | None:
    for row in stat_rows(show_stat):
        if row.backend == target.backend and row.server == target.server:
            return row
    return None


def servers_not_up(read_stdout: str) -> list[str]:
    """ "backend/server STATUS" of every server of the gateway that is not UP, from the read script's output
    (`show stat`): HAProxy starts each server DOWN until its check (a 1-token generation) passes, so a
    gateway started beside instances that still load has none to send requests to. A gateway without its
    runtime socket yet counts as one server not up."""
    read = parse_read(read_stdout)
    if read.no_socket or not read.replies:
        return ["the runtime socket: not there yet"]
    return [
        f"{r.backend}/{r.server} {r.status}"
        for r in stat_rows(read.replies[0])
        if not r.status.startswith("UP")
    ]


@dataclass(frozen=True)
class Verdict:
    state: str  # "waiting" | "drained" | "timeout"
    reason: str
    scur: int | None
    running: float | None
    waiting: float | None

    @property
    def final(self) -> bool:
        return self.state != "waiting"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vllm_in_flight(metrics_text: str | None) -> tuple[float | None, float | None]:
    """(running, waiting) from vLLM's /metrics; (None, None) when it could not be read."""
    if not metrics_text:
        return None, None
    samples = parse_prometheus(metrics_text)
    return metric_total(samples, RUNNING), metric_total(samples, WAITING)


def drain_verdict(row: StatRow | None, read: Read, waited_s: float, timeout_s: float) -> Verdict:
    """Drained when the gateway holds no session to the server and vLLM runs and queues nothing."""
    scur = row.scur if row else None
    running, waiting = vllm_in_flight(read.metrics)
    if row is not None and scur == 0 and running == 0 and waiting == 0:
        return Verdict("drained", "no session at the gateway, nothing running or waiting in vLLM", 0, 0, 0)
    if row is not None and scur == 0 and read.metrics is None and row.status.startswith("DOWN"):
        # the gateway's check fails and the API does not answer: the instance is not serving (not started
        # yet, or crashed), so nothing is in flight there
        return Verdict("drained", f"not serving ({read.metrics_error or 'no /metrics'})", 0, None, None)
    if row is None:
        why = "the gateway does not show the server"
    elif scur:
        why = f"{scur} session(s) at the gateway"
    elif running is None or waiting is None:
        why = f"vLLM's /metrics not read ({read.metrics_error or 'no gauges'})"
    else:
        why = f"vLLM has {running:g} running and {waiting:g} waiting"
    if waited_s >= timeout_s:
        return Verdict("timeout", f"not drained within {timeout_s:g} s: {why}", scur, running, waiting)
    return Verdict("waiting", why, scur, running, waiting)
