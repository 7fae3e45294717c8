"""The repository is the collection vllm_fleet.serving: its metadata agrees with pyproject.toml, the clone
finds it through ansible_collections/vllm_fleet/serving, the project calls its own content by FQCN, and the
Galaxy artifact builds, installs into a folder outside the clone and shows every module, filter, callback and
role there with ansible-doc; the wheel ships the same files as ansible_collections/vllm_fleet/serving, and a
fresh venv holding only the wheel resolves modules, the site playbook and rollout's playbook in site-packages
(real ansible-galaxy, pip wheel, uv, ansible-doc and ansible-playbook; about 13 s)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from wheelvenv import build_wheel_venv, uv_build

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
FQCN = "vllm_fleet.serving"
ROLES = sorted(p.parent.parent.name for p in REPO.glob("roles/*/meta/main.yml"))
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
ACTIONS = sorted(p.stem for p in (REPO / "plugins" / "action").glob("*.py"))
CALLBACKS = sorted(p.stem for p in (REPO / "plugins" / "callback").glob("*.py"))
FILTERS = sorted(p.stem for p in (REPO / "plugins" / "filter").glob("*.yml"))
# every YAML file Ansible runs: playbooks, role tasks/handlers/defaults/vars, molecule scenarios
CONTENT = sorted(
    [
        REPO / "site.yml",
        *REPO.glob("playbooks/*.yml"),
        *REPO.glob("roles/*/*/*.yml"),
        *REPO.glob("molecule/*/*.yml"),
    ]
)


def test_metadata_agrees_with_pyproject() -> None:
    assert (GALAXY["namespace"], GALAXY["name"]) == ("vllm_fleet", "serving")
    assert GALAXY["version"] == PYPROJECT["project"]["version"]
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    core = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("ansible-core"))
    assert SpecifierSet(runtime["requires_ansible"]) == SpecifierSet(core.removeprefix("ansible-core"))


def test_the_clone_holds_itself_as_the_collection() -> None:
    link = REPO / "ansible_collections" / "vllm_fleet" / "serving"
    assert link.is_symlink() and os.readlink(link) == "../.."
    assert link.resolve() == REPO


def test_every_action_has_its_documentation_module() -> None:
    assert ACTIONS and set(ACTIONS) <= set(MODULES)


def test_the_project_calls_its_own_content_by_fqcn() -> None:
    short = []
    plugin = re.compile(rf"^\s*-?\s*({'|'.join(MODULES)}):", re.MULTILINE)
    filt = re.compile(rf"\|\s*({'|'.join(FILTERS)})\b")
    role = re.compile(rf"^\s*-?\s*(?:role|name):\s*['\"]?({'|'.join(ROLES)})['\"]?\s*$", re.MULTILINE)
    for path in CONTENT:
        text = path.read_text()
        for pattern in (plugin, filt, role):
            short += [f"{path.relative_to(REPO)}: {m.group(1)}" for m in pattern.finditer(text)]
    assert not short, "call these by vllm_fleet.serving.<name>: " + ", ".join(short)
    assert len(FILTERS) >= 39 and len(ROLES) == 11  # 9 + fleet_loadtest, fleet_gateway (issue 30)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("collection")
    config = work / "ansible.cfg"
    config.write_text("[defaults]\n")  # not the clone's: only the installed copy may be found
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_NOCOLOR": "1"}
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work), str(REPO)],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    artifact = work / f"vllm_fleet-serving-{GALAXY['version']}.tar.gz"
    # --force: a copy elsewhere on the default collections path (molecule's prerun leaves one in
    # ~/.ansible/collections) would otherwise make ansible-galaxy say "already installed" and copy nothing
    cols = work / "cols"
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--force", "-p", str(cols), str(artifact)],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    assert (cols / "ansible_collections/vllm_fleet/serving/MANIFEST.json").is_file(), install.stdout
    return {"work": work, "artifact": artifact, "cols": work / "cols", "config": config}


def test_the_artifact_holds_the_content_and_nothing_of_the_clone(installed: dict[str, Path]) -> None:
    with tarfile.open(installed["artifact"]) as tar:
        names = tar.getnames()
    tops = {n.split("/")[0] for n in names}
    assert {"roles", "plugins", "playbooks", "meta", "MANIFEST.json", "README.md", "LICENSE"} <= tops
    assert not tops & {"tests", "src", ".venv", "ansible_collections", "reports", "ansible.cfg", "inventory"}
    assert not [n for n in names if "__pycache__" in n]


def test_an_image_build_finds_the_library_the_plugins_import(installed: dict[str, Path]) -> None:
    """meta/execution-environment.yml is the collection's EE metadata, which ansible-builder introspects in
    every collection of an image: requirements.txt pins the library of this very version (a Galaxy install
    alone has no `vllm_fleet` to import), bindep.txt the controller's ssh."""
    pinned = f"{PYPROJECT['project']['name']}=={PYPROJECT['project']['version']}"
    shipped = installed["cols"] / "ansible_collections" / "vllm_fleet" / "serving" / "requirements.txt"
    assert [ln for ln in shipped.read_text().splitlines() if ln and not ln.startswith("#")] == [pinned]
    out = subprocess.run(
        [str(BIN / "ansible-builder"), "introspect", str(installed["cols"])],
        cwd=installed["work"], capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{pinned}  # from collection {FQCN}" in out.stdout, out.stdout
    assert f"openssh-client [platform:dpkg]  # from collection {FQCN}" in out.stdout, out.stdout


def _doc_list(installed: dict[str, Path], kind: str) -> dict:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(installed["config"]),
        "ANSIBLE_COLLECTIONS_PATH": str(installed["cols"]),
        # only the installed artifact answers (not a copy on sys.path, nor the clone)
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
        "ANSIBLE_NOCOLOR": "1",
    }
    out = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", kind, "-l", FQCN, "--json"],
        cwd=installed["work"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("kind", "names"),
    [("module", MODULES), ("filter", FILTERS), ("callback", CALLBACKS), ("role", ROLES)],
    ids=["module", "filter", "callback", "role"],
)
def test_ansible_doc_shows_everything_by_fqcn_from_the_installed_artifact(
    installed: dict[str, Path], kind: str, names: list[str]
) -> None:
    listed = _doc_list(installed, kind)
    assert sorted(listed) == sorted(f"{FQCN}.{n}" for n in names)
    if kind != "role":  # a role's entry is its specs; every other plugin's is its short description
        undocumented = [n for n, d in listed.items() if not d or d == "UNDOCUMENTED"]
        assert not undocumented, undocumented


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel `pip wheel` builds from the clone, in a fresh venv (uv: seconds, from its cache)."""
    work = tmp_path_factory.mktemp("wheel")
    wheel, venv = build_wheel_venv(work, timeout=300)
    return {"work": work, "wheel": wheel, "venv": venv}


def test_the_wheel_ships_the_files_of_the_galaxy_artifact(
    installed: dict[str, Path], wheel_venv: dict[str, Path]
) -> None:
    prefix = "ansible_collections/vllm_fleet/serving/"
    with zipfile.ZipFile(wheel_venv["wheel"]) as whl:
        shipped = {n.removeprefix(prefix) for n in whl.namelist() if n.startswith(prefix)}
    with tarfile.open(installed["artifact"]) as tar:
        packed = {m.name for m in tar.getmembers() if m.isfile()} - {"MANIFEST.json", "FILES.json"}
    assert "playbooks/site.yml" in shipped and "plugins/modules/vllm_fleet_plan.py" in shipped
    # Galaxy turns galaxy.yml into MANIFEST.json; the wheel keeps galaxy.yml (the version ansible-core reads)
    assert shipped - {"galaxy.yml"} == packed


def test_a_venv_with_only_the_wheel_resolves_the_collection(wheel_venv: dict[str, Path]) -> None:
    work, bindir = wheel_venv["work"], wheel_venv["venv"] / "bin"
    config = work / "ansible.cfg"
    config.write_text("[defaults]\n")  # no collections_path: only sys.path (site-packages) can hold it
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(work),
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_COLLECTIONS_PATH": str(work / "none"),
        "ANSIBLE_NOCOLOR": "1",
    }
    doc = subprocess.run(
        [str(bindir / "ansible-doc"), "--json", f"{FQCN}.vllm_fleet_plan"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert doc.returncode == 0, doc.stderr[-3000:]
    found = json.loads(doc.stdout)[f"{FQCN}.vllm_fleet_plan"]["doc"]["filename"]
    assert "/site-packages/ansible_collections/vllm_fleet/serving/" in found
    listed = subprocess.run(
        [str(bindir / "ansible-playbook"), "--list-tasks", "-i", "localhost,", f"{FQCN}.site"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    assert "Verify" in listed.stdout and "Preflight" in listed.stdout
    # `vllm-fleet rollout` from this venv plays the installed collection's rollout.yml
    code = "from vllm_fleet.project import project_dir as d; print(d())"
    project = subprocess.run(
        [str(bindir / "python"), "-c", code], cwd=work, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert project.endswith("/site-packages/ansible_collections/vllm_fleet/serving")
    assert (Path(project) / "playbooks" / "rollout.yml").is_file()


def test_the_sdist_holds_the_collection_and_rebuilds_the_same_wheel(
    tmp_path: Path, wheel_venv: dict[str, Path]
) -> None:
    # pip installs an sdist by building a wheel from it: setup.py's build_py copies the collection from the
    # unpacked sdist, so a file MANIFEST.in leaves out breaks that build or goes missing from the wheel
    sdist = uv_build("sdist", tmp_path / "sdist", timeout=300)
    assert sdist.returncode == 0, sdist.stdout + sdist.stderr
    (archive,) = (tmp_path / "sdist").glob("vllm_fleet-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name}
    wanted = ["galaxy.yml", "meta/runtime.yml", "playbooks/site.yml", "roles/vllm_verify/tasks/main.yml"]
    for path in [*wanted, "plugins/modules/vllm_fleet_plan.py", "plugins/filter/vllm_fleet_report_dir.yml"]:
        assert path in names, f"the sdist lacks {path} (MANIFEST.in)"
    build = subprocess.run(
        [str(BIN / "pip"), "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(archive)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    prefix = "ansible_collections/vllm_fleet/serving/"

    def collection(wheel: Path) -> set[str]:
        with zipfile.ZipFile(wheel) as whl:
            return {n for n in whl.namelist() if n.startswith(prefix)}

    (rebuilt,) = (tmp_path / "dist").glob("vllm_fleet-*.whl")
    assert collection(rebuilt) == collection(wheel_venv["wheel"])
