"""The generated files of `vllm-fleet gateway` and roles/fleet_gateway: haproxy.cfg and gateway.json."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from vllm_fleet.gateway.haproxy import GatewaySettings, haproxy_config
from vllm_fleet.gateway.sets import InstanceSet

HAPROXY = "haproxy.cfg"
SUMMARY = "gateway.json"


def gateway_summary(sets: Sequence[InstanceSet], settings: GatewaySettings) -> dict:
    """What the config routes where (the role, the tests and a reader of the report use it)."""
    return {
        "port": settings.port,
        "listen_address": settings.listen_address,
        "keyed": settings.keyed,
        "runtime_socket": settings.runtime_socket,
        "sets": [
            {
                "name": s.name,
                "backend": s.backend,
                "max_model_len": s.max_model_len,
                "threshold_bytes": s.threshold_bytes,
                "servers": [asdict(server) for server in s.servers],
            }
            for s in sets
        ],
    }


def gateway_files(sets: Sequence[InstanceSet], settings: GatewaySettings, *, source: str) -> dict[str, str]:
    return {
        HAPROXY: haproxy_config(sets, settings, source=source),
        SUMMARY: json.dumps(gateway_summary(sets, settings), indent=2) + "\n",
    }


def write_files(files: dict[str, str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
