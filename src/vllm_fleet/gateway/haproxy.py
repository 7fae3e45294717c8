"""haproxy.cfg for the gateway: one frontend, one backend per instance set, a readiness check per server.

Why these settings:
- `option http-buffer-request` makes HAProxy wait for the body before it picks a backend, so `req.body_size`
  (the body's advertised size, Content-Length or the chunks' sum) is known; bodies are routed by it
  (vllm_fleet.gateway.sets).
- The check is a real generation (POST /v1/completions, max_tokens 1): vLLM answers /health 200 while it
  drains or refuses new work with HTTP 500 (shared research fleet-serving §2.2), so /health alone would keep
  sending requests to an instance that fails them.
- The runtime API (`stats socket ... level admin`, root only) drains a server (`set server set_x/srv state
  drain`: no new requests, those in flight go on) and shows its sessions (`show stat`: scur); `expose-fd
  listeners` lets a reload hand the listening sockets to the new process, so a reload drops no connection.
- The API key never appears here: `"${VLLM_FLEET_GATEWAY_KEY}"` is expanded by HAProxy from its environment,
  which systemd reads from a 0600 file (roles/fleet_gateway).
- A set whose servers are all out (drained for a restart, or failing their check) sends what fits it to the
  next larger set (`nbsrv`), so a fleet with one instance per set still serves during a rollout.
- `retry-on conn-failure empty-response` with `option redispatch`: a request that found an instance gone
  (refused, or closed before any answer) goes to another one; nothing is retried once an answer has started.
- Server timeouts are inactivity timeouts: a non-streaming long generation sends nothing for minutes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_fleet.errors import FleetInputError
from vllm_fleet.gateway.sets import InstanceSet
from vllm_fleet.hostvalues import is_loopback

KEY_ENV = "VLLM_FLEET_GATEWAY_KEY"
FRONTEND = "vllm"
RUNTIME_SOCKET = "/run/haproxy/admin.sock"
# Debian's haproxy listens nowhere by default; 4000 stays clear of vLLM (8000 + instance), Prometheus (9090),
# node_exporter (9100) and the GPU exporter (9400).
PORT = 4000


@dataclass(frozen=True)
class GatewaySettings:
    """The fleet_gateway_* variables that shape haproxy.cfg."""

    listen_address: str = "127.0.0.1"
    port: int = PORT
    keyed: bool = False  # clients must send `Authorization: Bearer <key>` (the key is in the environment)
    allow_unauthenticated: bool = False
    runtime_socket: str = RUNTIME_SOCKET
    check_interval_s: int = 5
    # HAProxy's fastinter and downinter: the interval while a server changes state or is down (0: the same as
    # check_interval_s). A long steady interval with a short one here finds a restarted instance soon
    # without a generation every few seconds on every healthy one.
    check_fast_interval_s: int = 0
    check_fall: int = 2
    check_rise: int = 1
    check_timeout_s: int = 30
    connect_timeout_s: int = 5
    server_timeout_s: int = 600
    client_timeout_s: int = 600
    maxconn: int = 4096

    def __post_init__(self) -> None:
        v = "fleet_gateway_"
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise FleetInputError(f"{v}port: {self.port!r} is not a TCP port; give e.g. {PORT}")
        if not self.runtime_socket.startswith("/"):
            raise FleetInputError(
                f"{v}runtime_socket: {self.runtime_socket!r} is not an absolute path; give e.g. "
                f"{RUNTIME_SOCKET}"
            )
        for name in (
            "check_interval_s",
            "check_fall",
            "check_rise",
            "check_timeout_s",
            "connect_timeout_s",
            "server_timeout_s",
            "client_timeout_s",
            "maxconn",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FleetInputError(f"{v}{name}: {value!r} is not a positive integer; give e.g. 5")
        fast = self.check_fast_interval_s
        if isinstance(fast, bool) or not isinstance(fast, int) or not 0 <= fast <= self.check_interval_s:
            raise FleetInputError(
                f"{v}check_fast_interval: {fast!r} is not 0 (the same as {v}check_interval) or a whole "
                f"number of seconds up to {v}check_interval ({self.check_interval_s}); give e.g. 2"
            )
        if not (self.keyed or self.allow_unauthenticated or is_loopback(self.listen_address)):
            raise FleetInputError(
                f"{v}listen_address: {self.listen_address or '(every interface)'!r} serves beyond this "
                "machine, "
                f"but {v}api_key is not set, so anyone who reaches port {self.port} may use every "
                "instance; set "
                f"{v}api_key (from Ansible Vault: the instances' vllm_service_api_key), or listen on "
                "127.0.0.1, "
                f"or set {v}allow_unauthenticated: true on purpose"
            )


def _bind(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address or '*'}:{port}"


def check_lines(model: str, keyed: bool) -> list[str]:
    """The readiness check: one real generation of one token, 200 or the server is out."""
    body = json.dumps({"model": model, "prompt": "ready?", "max_tokens": 1}, separators=(",", ":"))
    if "'" in body:
        raise FleetInputError(
            f"vllm_service_served_model_name: {model!r} holds a quote, which the gateway's check cannot "
            "carry; "
            "give a name without quotes"
        )
    auth = f' hdr Authorization "Bearer ${{{KEY_ENV}}}"' if keyed else ""
    return [
        "    option httpchk",
        "    http-check send meth POST uri /v1/completions ver HTTP/1.1 hdr Host gateway-check"
        f" hdr Content-Type application/json{auth} body '{body}'",
        "    http-check expect status 200",
    ]


def _fast_intervals(settings: GatewaySettings) -> str:
    fast = settings.check_fast_interval_s
    return f" fastinter {fast}s downinter {fast}s" if fast else ""


def backend_lines(instance_set: InstanceSet, settings: GatewaySettings) -> list[str]:
    lines = [
        f"backend {instance_set.backend}",
        f"    # set {instance_set.name}: planned max_model_len "
        f"{instance_set.max_model_len or 'the model default'}"
        + (f", bodies up to {instance_set.threshold_bytes} bytes" if instance_set.threshold_bytes else ""),
        # the instance with the fewest requests in flight: generations differ in length by orders of magnitude
        "    balance leastconn",
        *check_lines(instance_set.servers[0].model, settings.keyed),
        f"    default-server check inter {settings.check_interval_s}s{_fast_intervals(settings)}"
        f" fall {settings.check_fall} rise {settings.check_rise}",
    ]
    lines += [f"    server {s.name} {s.address}" for s in instance_set.servers]
    return lines


def frontend_lines(sets: Sequence[InstanceSet], settings: GatewaySettings) -> list[str]:
    lines = [
        f"frontend {FRONTEND}",
        f"    bind {_bind(settings.listen_address, settings.port)}",
        "    option http-buffer-request",
    ]
    if settings.keyed:
        lines += [
            f'    acl key_ok req.hdr(authorization) -m str "Bearer ${{{KEY_ENV}}}"',
            "    http-request deny deny_status 401 unless key_ok",
        ]
    # the smallest set a body fits that has a server to take it: while a set's only instance is drained (a
    # restart), what fits it goes to the next larger set instead of getting a 503
    for instance_set in sets[:-1]:
        size, backend = instance_set.threshold_bytes, instance_set.backend
        fits, served = f"{{ req.body_size le {size} }}", f"{{ nbsrv({backend}) gt 0 }}"
        lines.append(f"    use_backend {backend} if {fits} {served}")
    lines.append(f"    default_backend {sets[-1].backend}")
    return lines


def haproxy_config(sets: Sequence[InstanceSet], settings: GatewaySettings, *, source: str) -> str:
    """The whole haproxy.cfg (Debian's package layout: user haproxy, logs to /dev/log)."""
    if not sets:
        raise FleetInputError("the gateway has no instance set: no host's plan has an instance")
    lines = [
        f"# Written by vllm-fleet (fleet_gateway) from {source}; regenerate rather than edit.",
        "global",
        "    log /dev/log local0",
        f"    stats socket {settings.runtime_socket} mode 600 level admin expose-fd listeners",
        "    stats timeout 30s",
        "    user haproxy",
        "    group haproxy",
        f"    maxconn {settings.maxconn}",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option redispatch",
        "    retries 2",
        "    retry-on conn-failure empty-response",
        f"    timeout connect {settings.connect_timeout_s}s",
        f"    timeout client {settings.client_timeout_s}s",
        f"    timeout server {settings.server_timeout_s}s",
        "    timeout http-request 30s",
        f"    timeout check {settings.check_timeout_s}s",
        "",
        *frontend_lines(sets, settings),
    ]
    for instance_set in sets:
        lines += ["", *backend_lines(instance_set, settings)]
    return "\n".join(lines) + "\n"
