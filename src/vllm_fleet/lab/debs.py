"""Debian packages the lab's extra services install offline (their hosts have no network): pinned bookworm
versions, fetched once with `apt-get download` into the lab cache, where the controller reaches Debian."""

from __future__ import annotations

import subprocess
from pathlib import Path

from vllm_fleet.lab.build import file_lock
from vllm_fleet.lab.spec import lab_root

# haproxy and what the lab's root filesystem (debootstrap bookworm) lacks of its dependencies
GATEWAY_DEBS = (
    "haproxy=2.6.12-1+deb12u4",
    "liblua5.3-0=5.3.6-2",
    "libopentracing-c-wrapper0=1.1.3-3+b1",
    "libopentracing1=1.6.0-4",
)
GATEWAY_DEB_DIR = "gateway-debs-bookworm-v1"


def fetch_debs(folder: Path, debs: tuple[str, ...]) -> Path:
    """`folder` holding one .deb per pin of `debs`, downloaded when any is missing. Held under a lock: two
    lab tests on the suite's two workers (the gateway lab, the multi-host lab's gateway) may ask at once."""
    with file_lock(folder.with_name(folder.name + ".lock")):
        if len(list(folder.glob("*.deb"))) != len(debs):
            folder.mkdir(parents=True, exist_ok=True)
            argv = ["apt-get", "download", *debs]
            done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"apt-get download {' '.join(debs)} failed: {done.stderr[-1000:]}")
    return folder


def gateway_debs() -> Path:
    return fetch_debs(lab_root() / "cache" / GATEWAY_DEB_DIR, GATEWAY_DEBS)


def gateway_group_vars() -> dict[str, object]:
    """The variables of a lab's `gateway` group: HAProxy from the lab cache's .debs, on every interface (the
    lab's addresses exist only in its namespaces), a healthy server checked every 10 s and one that failed a
    check or is down every 2 s. A check is a generation, after which vLLM's worker busy-polls its queue for a
    second: an idle lab instance checked every 2 s kept 40 % of a core busy (issue 32)."""
    return {
        "fleet_gateway_deb_dir": str(gateway_debs()),
        "fleet_gateway_listen_address": "0.0.0.0",
        "fleet_gateway_check_interval": 10,
        "fleet_gateway_check_fast_interval": 2,
    }
