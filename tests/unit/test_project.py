"""Where the commands find the roles and playbooks: a clone's own folders, or the collection the wheel
installs beside the package (issue 32: the wheel's `vllm-fleet plan --inventory` looked beside the source
tree). The layouts are made in a temporary folder with the files each one really has; the installed wheel
itself is run by tests/integration/test_installed_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.project import fleet_report_dir, project_dir

ROOT = Path(__file__).resolve().parents[2]


def _content(folder: Path) -> Path:
    (folder / "roles").mkdir(parents=True)
    (folder / "galaxy.yml").write_text("namespace: vllm_fleet\n")
    return folder


def _module(package_parent: Path) -> Path:
    module = package_parent / "vllm_fleet" / "project.py"
    module.parent.mkdir(parents=True)
    module.write_text("")
    return module


def test_this_clone_is_its_own_project() -> None:
    assert project_dir() == ROOT
    assert fleet_report_dir(ROOT, Path("/elsewhere")) == ROOT / "reports"


def test_the_wheels_layout_finds_the_collection_beside_the_package(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    module = _module(site)
    collection = _content(site / "ansible_collections" / "vllm_fleet" / "serving")
    assert project_dir(module) == collection
    # reports go to the working directory's reports/, never into site-packages
    assert fleet_report_dir(collection, tmp_path / "work") == tmp_path / "work" / "reports"


def test_a_clone_wins_over_a_collection_beside_its_package(tmp_path: Path) -> None:
    clone = _content(tmp_path / "clone")
    (clone / "pyproject.toml").write_text("")
    module = _module(clone / "src")
    _content(clone / "src" / "ansible_collections" / "vllm_fleet" / "serving")
    assert project_dir(module) == clone


def test_neither_layout_is_an_error_that_says_where_it_looked(tmp_path: Path) -> None:
    module = _module(tmp_path / "lib")
    looked = r"neither .* \(a clone\) nor .*/lib/ansible_collections/vllm_fleet/serving"
    with pytest.raises(FleetInputError, match=looked):
        project_dir(module)
