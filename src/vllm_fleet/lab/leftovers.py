"""What the project and its tests leave on this machine outside the lab root, and its removal
(`vllm-fleet lab clean --all`; issue 32: after the suite and `lab clean`, 2.5 GB of venvs, pytest's
temporary folders and the package caches were still there).

Every such place is named here, once, and the code that fills it takes its path from here: the vLLM CPU
venvs of the argv check (tests/integration/test_render_real_parser.py), the vLLM wheels the flag catalog is
read from (scripts/gen_flag_catalog.py), the uv and pip caches the suite uses (tests/conftest.py points uv
and pip there, so that the user's own caches are neither filled nor removed), and pytest's temporary
folders. The lab root (/var/lib/vllm-fleet-lab) is `lab clean`'s own (vllm_fleet.lab.run.clean). Every path
is an argument, so a test can remove a temporary copy of the layout instead of the machine's.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from vllm_fleet.lab.build import remove_tree

VAR_CACHE = Path("/var/cache")
VENV_CACHE_ENV = "VLLM_FLEET_VENV_CACHE"
WHEEL_CACHE_ENV = "VLLM_FLEET_WHEEL_CACHE"


@dataclass(frozen=True)
class Leftovers:
    venv_cache: Path  # vLLM CPU venvs for the real argument parser (test_render_real_parser), ~2.5 GB
    wheel_cache: Path  # vLLM release wheels and sources for the flag catalog (gen_flag_catalog), ~1.2 GB
    package_cache: Path  # the suite's uv and pip caches (<it>/uv, <it>/pip)
    pytest_tmp: Path  # pytest's tmp_path folders (the last three runs' are kept by pytest itself)

    def paths(self) -> list[Path]:
        return [getattr(self, f.name) for f in fields(self)]


def leftovers(
    env: Mapping[str, str] | None = None,
    *,
    var_cache: Path = VAR_CACHE,
    tmp: Path | None = None,
    home: Path | None = None,
    user: str | None = None,
) -> Leftovers:
    """The places, as `env` names them (the variables the code that fills them reads)."""
    env = os.environ if env is None else env
    home = home or Path.home()
    cache_home = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    return Leftovers(
        venv_cache=Path(env.get(VENV_CACHE_ENV) or var_cache / "vllm-fleet-venvs"),
        wheel_cache=Path(env.get(WHEEL_CACHE_ENV) or var_cache / "vllm-fleet-wheels"),
        package_cache=cache_home / "vllm-fleet",
        pytest_tmp=(tmp or Path(tempfile.gettempdir())) / f"pytest-of-{user or getpass.getuser()}",
    )


def tree_bytes(path: Path) -> int:
    """The bytes of the files under `path`, links not followed."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def remove_leftovers(places: Leftovers, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Remove each place that exists; `{"removed": [paths], "bytes_freed": n}`."""
    removed: list[str] = []
    freed = 0
    for path in places.paths():
        if not (path.exists() or path.is_symlink()):
            continue
        size = tree_bytes(path)
        remove_tree(path)
        removed.append(str(path))
        freed += size
        log(f"lab clean: removed {path} ({size / 1e6:.0f} MB)")
    return {"removed": removed, "bytes_freed": freed}
