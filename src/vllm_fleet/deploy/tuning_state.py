"""What host_tuning does on a host, from one read of it (the module vllm_fleet_host_state) and the tuning plan
(the filter host_tuning_plan): every item empty or false on a converged host (issue 21), so the role's change
tasks are skipped as one include."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm_fleet.deploy import filestate

FSTAB = "/etc/fstab"
TUNING_UNIT = "vllm-fleet-tuning.service"
# the regexp of the role's lineinfile task: the /dev/shm line of /etc/fstab
SHM_FSTAB_LINE = re.compile(r"^\S+\s+/dev/shm\s")


def fstab_has(text: str | None, line: str) -> bool:
    """Whether ansible.builtin.lineinfile (regexp SHM_FSTAB_LINE, `line`) would leave `text` as it is: the
    last line the regexp matches is `line`, or, with none matching, `line` is there verbatim."""
    lines = (text or "").splitlines()
    matching = [row for row in lines if SHM_FSTAB_LINE.search(row + "\n")]
    return matching[-1] == line if matching else line in lines


def decide_host(
    tuning: Mapping[str, Any],
    managed: list[Mapping[str, Any]],
    state: Mapping[str, Any],
    *,
    grub_dropin: str,
    grub_text: str,
    apply_runtime: bool,
) -> dict[str, Any]:
    """-> "writes" (the managed files that differ, each with "drift"), "grub" ("write", "remove" or ""),
    "enable" (the tuning unit must be enabled or reloaded), "unit_written", "fstab" (the /dev/shm line is
    missing or differs), "apply" (runtime settings differ and are applied), "changes" (one line each)."""
    files = state.get("files") or {}
    writes = filestate.drifted(list(managed), files)
    changes = [f"{w['path']}: {w['drift']}" for w in writes]
    grub = ""
    if tuning.get("kernel_cmdline"):
        item = {"path": grub_dropin, "content": grub_text, "owner": "root", "group": "root", "mode": "0644"}
        if filestate.drifted([item], {grub_dropin: files.get(grub_dropin) or {"exists": False}}):
            grub = "write"
    elif (files.get(grub_dropin) or {}).get("exists"):
        grub = "remove"
    if grub:
        changes.append(f"{grub_dropin}: {grub}")
    unit_written = any(w["path"].endswith("/" + TUNING_UNIT) for w in writes)
    unit = (state.get("units") or {}).get(TUNING_UNIT) or {}
    enable = unit_written or unit.get("UnitFileState") != "enabled"
    if enable and not unit_written:
        changes.append(f"{TUNING_UNIT}: {unit.get('UnitFileState') or 'unknown'}, not enabled")
    shm = tuning.get("shm")
    fstab = bool(shm) and not fstab_has((state.get("contents") or {}).get(FSTAB), shm["fstab_line"])
    if fstab:
        changes.append(f"{FSTAB}: the /dev/shm line differs")
    apply = bool(apply_runtime) and len(tuning.get("changes") or []) > 0
    if apply:
        changes += list(tuning["changes"])
    return {
        "writes": writes,
        "grub": grub,
        "enable": enable,
        "unit_written": unit_written,
        "fstab": fstab,
        "apply": apply,
        "changes": changes,
    }
