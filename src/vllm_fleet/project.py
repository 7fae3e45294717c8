"""Where this project's Ansible content (roles/, playbooks/, site.yml) is, for the commands that read it.

Two layouts exist: a clone (or an editable install of one), where the package runs from <clone>/src/vllm_fleet
and the content sits at <clone>; and the wheel, which installs the package as <site-packages>/vllm_fleet and
the collection beside it as <site-packages>/ansible_collections/vllm_fleet/serving (setup.py). Nothing may be
anchored on this file's location in any other way: a path that only holds in a clone is a crash after
`pip install` (issue 32).
"""

from __future__ import annotations

from pathlib import Path

from vllm_fleet.errors import FleetInputError

COLLECTION = ("ansible_collections", "vllm_fleet", "serving")
# present in both layouts: the collection's metadata (setup.py ships it), the roles' argument specs beside it
MARKER = "galaxy.yml"


def project_dir(here: Path | None = None) -> Path:
    """The folder holding roles/, playbooks/ and site.yml: the clone this package runs from, else the
    collection the wheel installed beside the package. `here` is this module's path (tests pass another)."""
    package = (here or Path(__file__)).resolve().parent  # .../vllm_fleet
    clone = package.parents[1]  # <clone>/src/vllm_fleet -> <clone>
    installed = package.parent.joinpath(*COLLECTION)  # <site-packages>/vllm_fleet -> its collection
    for candidate in (clone, installed):
        if (candidate / MARKER).is_file() and (candidate / "roles").is_dir():
            return candidate
    raise FleetInputError(
        f"the roles and playbooks of vllm-fleet are in neither {clone} (a clone) nor {installed} (the "
        f"collection the wheel installs): reinstall with `pip install vllm_fleet-*.whl` or run from a clone"
    )


def is_clone(project: Path) -> bool:
    """A clone holds the Python project itself; the installed collection does not."""
    return (project / "pyproject.toml").is_file()


def fleet_report_dir(project: Path, cwd: Path) -> Path:
    """The reports folder the commands read and write by default (`vllm_fleet_report_dir` unset): the clone's
    reports/ when running from a clone (where its playbooks write them), else `cwd`'s reports/ (never
    site-packages), as the collection's playbooks do (vllm_fleet.reportdir)."""
    return (project if is_clone(project) else cwd) / "reports"
