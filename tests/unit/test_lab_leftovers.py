"""`vllm-fleet lab clean --all`'s list: every place the project and its tests fill outside the lab root, and
nothing else (issue 32). Run against a temporary copy of the layout (var_cache, tmp and home are arguments):
the machine's own caches are in use by other runs. The lab root's part is `lab clean` itself
(tests/integration/test_lab.py runs it on a lab root of its own)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from vllm_fleet.lab.leftovers import leftovers, remove_leftovers

ROOT = Path(__file__).resolve().parents[2]


def _fill(folder: Path, size: int = 1000) -> None:
    folder.mkdir(parents=True)
    (folder / "data").write_bytes(b"x" * size)


def test_clean_all_removes_the_projects_places_and_nothing_beside_them(tmp_path: Path) -> None:
    var_cache, tmp, home = tmp_path / "var-cache", tmp_path / "tmp", tmp_path / "home"
    places = leftovers({}, var_cache=var_cache, tmp=tmp, home=home, user="someone")
    assert places.paths() == [
        var_cache / "vllm-fleet-venvs",
        var_cache / "vllm-fleet-wheels",
        home / ".cache" / "vllm-fleet",
        tmp / "pytest-of-someone",
    ]
    for path in places.paths():
        _fill(path / "inner")
    others = [var_cache / "apt", tmp / "pytest-of-other", home / ".cache" / "uv", home / ".cache" / "pip"]
    for path in others:
        _fill(path)
    logged: list[str] = []
    result = remove_leftovers(places, log=logged.append)
    assert result == {"removed": [str(p) for p in places.paths()], "bytes_freed": 4000}
    assert not [p for p in places.paths() if p.exists()]
    assert all(p.is_dir() for p in others)
    assert len(logged) == 4 and "vllm-fleet-venvs (0 MB)" in logged[0]
    assert remove_leftovers(places) == {"removed": [], "bytes_freed": 0}  # a second run finds nothing


def test_the_places_follow_the_variables_the_code_that_fills_them_reads(tmp_path: Path) -> None:
    env = {
        "VLLM_FLEET_VENV_CACHE": str(tmp_path / "venvs"),
        "VLLM_FLEET_WHEEL_CACHE": str(tmp_path / "wheels"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    places = leftovers(env, tmp=tmp_path, user="u")
    assert places.venv_cache == tmp_path / "venvs" and places.wheel_cache == tmp_path / "wheels"
    assert places.package_cache == tmp_path / "xdg" / "vllm-fleet"


def test_every_machine_path_the_project_names_is_on_the_list() -> None:
    # a new /var/cache/vllm-fleet-* folder in a script or test must be added to vllm_fleet.lab.leftovers
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "*.py", "scripts/*", "*.sh"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    named = {
        match
        for name in tracked
        # validate/table.py names the roles' defaults: paths on the managed hosts, as roles/*/defaults do
        if (ROOT / name).is_file() and not name.endswith(("leftovers.py", "validate/table.py"))
        for match in re.findall(r"/var/cache/vllm-fleet-[\w.-]+", (ROOT / name).read_text(errors="replace"))
    }
    listed = {str(p) for p in leftovers({}).paths()}
    assert named and named <= listed, named - listed


def test_lab_clean_empties_a_lab_root_of_its_caches_and_counts_their_bytes(tmp_path: Path) -> None:
    # `lab clean` (no --all) on a lab root of its own with no lab in it: the cached artefacts go, a link to
    # another root's artefact is removed without following it, and the empty root itself goes too
    from vllm_fleet.lab.run import clean

    root, elsewhere = tmp_path / "lab-root", tmp_path / "another-root-artefact"
    _fill(root / "cache" / "rootfs-x", 3000)
    _fill(elsewhere, 5000)
    (root / "cache" / "installed-y").symlink_to(elsewhere)
    result = clean(root=root)
    assert result["labs"] == [] and result["root_removed"] and not root.exists()
    assert result["bytes_freed"] == 3000 + len(str(elsewhere))  # the link's own size, not its target's
    assert (elsewhere / "data").stat().st_size == 5000
