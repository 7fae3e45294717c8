"""The check of the serve commands with the installed vLLM's own parser, before anything changes on a host.

    check_input(files, restart) -> {"argvs": {name: argv}}   what roles/vllm_service/files/vllm_argv_check.py
                                                            reads: every instance that (re)starts, one import
    rejections(result, check_mode) -> ["name: error", ...]  what stops the play (nothing is written)

The script imports vLLM (torch, transformers: 8-14 s of CPU on a lab host) once for all of a host's instances;
a check per instance paid that import once per instance (four on the 4 x 4090 reference layout).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# the script's exit statuses (its docstring): 2 vLLM rejects an argv, 3 no vLLM to import or bad input
REJECTED = 2


def check_input(files: list[Mapping[str, Any]], restart: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The script's batch input: the argv of every instance in `restart` (vllm_service_decide's), by name."""
    restarting = {r["name"] for r in restart}
    return {"argvs": {f["name"]: list(f["plan"]["argv"]) for f in files if f["name"] in restarting}}


def rejections(result: Mapping[str, Any], check_mode: bool) -> list[str]:
    """Each rejected instance as "name: vLLM's message" from the check task's registered result; [] when it
    passed or did not run. In check mode a host without vLLM yet (status 3) is no error; a rejection is."""
    if result.get("skipped") or "rc" not in result:
        return []
    rc = int(result["rc"])
    if rc == 0 or (check_mode and rc != REJECTED):
        return []
    lines = str(result.get("stdout") or "").strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else {}
    except ValueError:
        said = {}
    failed = [
        f"{name}: {one.get('error')}"
        for name, one in (said.get("results") or {}).items()
        if not one.get("ok")
    ]
    if failed:
        return failed
    # the script could not check at all (no vLLM in the venv, unreadable input): one message for all
    why = said.get("error") or str(result.get("stderr") or "").strip() or str(result.get("msg") or "")
    return [f"every instance: {why or f'the check exited {rc}'}"]
