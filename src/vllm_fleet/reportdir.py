"""Where the controller writes reports: one setting, `vllm_fleet_report_dir`, for every role and playbook.

Unset, it is the controller's current directory's `reports/`: a collection playbook's `playbook_dir` is
inside site-packages (or, in AWX, a throw-away project copy), so no default may be anchored there. In a clone
run from its root this is `<clone>/reports`, the folder the project always used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError

VARIABLE = "vllm_fleet_report_dir"
DEFAULT = "reports"


def report_dir(value: Any, sub: str = "", cwd: str | os.PathLike[str] | None = None) -> str:
    """The absolute folder `<vllm_fleet_report_dir>/<sub>`: `value` empty or None means `reports`, a
    relative `value` is taken from `cwd` (default: the process's working directory)."""
    if value is None or value == "":
        value = DEFAULT
    if not isinstance(value, (str, os.PathLike)):
        raise FleetInputError(
            f"{VARIABLE} must be a folder path (absolute, or relative to the current directory), "
            f"not {type(value).__name__} {value!r}"
        )
    text = os.fspath(value)
    if "\0" in text or not text.strip():
        raise FleetInputError(
            f"{VARIABLE} {text!r} is not a usable folder path; give e.g. /srv/fleet/reports"
        )
    if not isinstance(sub, str) or Path(sub).is_absolute() or ".." in Path(sub).parts:
        raise FleetInputError(f"the subfolder {sub!r} of {VARIABLE} must be a relative path inside it")
    base = Path(os.path.expanduser(text))
    if not base.is_absolute():
        base = Path(cwd if cwd is not None else os.getcwd()) / base
    folder = Path(os.path.normpath(base / sub)) if sub else Path(os.path.normpath(base))
    return str(folder)
