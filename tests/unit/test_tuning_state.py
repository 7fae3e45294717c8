"""host_tuning from one read of the host (issue 21): vllm_fleet.deploy.tuning_state.decide_host over the
module vllm_fleet_host_state's real readers on real files: nothing to do when converged; a hand-edited sysctl
file, a disabled boot unit, a changed /dev/shm line of /etc/fstab, a grub drop-in to write or remove, and
runtime settings that differ are each found."""

from __future__ import annotations

from pathlib import Path

from pluginload import load_plugin

from vllm_fleet.deploy import tuning_state as ts

REPO = Path(__file__).resolve().parents[2]
MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_host_state.py", "host_state_tuning_test")
FILTERS = load_plugin(REPO / "plugins" / "filter" / "host_tuning_plan.py", "tuning_filter_state_test")
SHM_LINE = "tmpfs /dev/shm tmpfs defaults,size=2147483648,huge=within_size 0 0"


def managed(tmp_path: Path) -> list[dict]:
    return [
        {
            "path": str(tmp_path / "90-vllm-fleet.conf"),
            "content": "kernel.numa_balancing = 0\n",
            "mode": "0644",
        },
        {"path": str(tmp_path / "vllm-fleet-tuning.service"), "content": "[Unit]\n", "mode": "0644"},
    ]


def read(tmp_path: Path, items: list[dict], unit_state: str = "enabled") -> dict:
    fstab = tmp_path / "fstab"
    return {
        "files": {i["path"]: MODULE.file_state(i["path"]) for i in items}
        | {str(tmp_path / "grub.cfg"): MODULE.file_state(str(tmp_path / "grub.cfg"))},
        "contents": {ts.FSTAB: MODULE.read_text(str(fstab))} if fstab.exists() else {},
        "units": {ts.TUNING_UNIT: {"UnitFileState": unit_state}},
    }


def converge(tmp_path: Path, items: list[dict]) -> None:
    for item in items:
        Path(item["path"]).write_text(item["content"])
        Path(item["path"]).chmod(0o644)
    (tmp_path / "fstab").write_text(f"proc /proc proc defaults 0 0\n{SHM_LINE}\n")


def decide(tmp_path: Path, state: dict, **tuning) -> dict:
    plan = {"kernel_cmdline": [], "shm": {"fstab_line": SHM_LINE}, "changes": [], **tuning}
    return ts.decide_host(
        plan,
        managed(tmp_path),
        state,
        grub_dropin=str(tmp_path / "grub.cfg"),
        grub_text="G\n",
        apply_runtime=True,
    )


def test_a_converged_host_has_nothing_to_do(tmp_path: Path) -> None:
    items = managed(tmp_path)
    converge(tmp_path, items)
    todo = decide(tmp_path, read(tmp_path, items))
    assert todo["changes"] == [] and not (todo["enable"] or todo["fstab"] or todo["apply"] or todo["grub"])


def test_a_hand_edited_sysctl_file_and_a_disabled_unit_are_found(tmp_path: Path) -> None:
    items = managed(tmp_path)
    converge(tmp_path, items)
    Path(items[0]["path"]).write_text("kernel.numa_balancing = 1\n")
    todo = decide(tmp_path, read(tmp_path, items, unit_state="disabled"))
    assert [w["path"] for w in todo["writes"]] == [items[0]["path"]]
    assert todo["writes"][0]["drift"] == "content differs"
    assert todo["enable"] and not todo["unit_written"]
    Path(items[1]["path"]).unlink()
    todo = decide(tmp_path, read(tmp_path, items))
    assert todo["unit_written"] and todo["enable"]  # a rewritten unit is reloaded and enabled


def test_the_dev_shm_line_of_fstab_is_compared_as_lineinfile_would(tmp_path: Path) -> None:
    assert ts.fstab_has(f"a b c\n{SHM_LINE}\n", SHM_LINE)
    assert not ts.fstab_has("tmpfs /dev/shm tmpfs defaults,size=1G 0 0\n", SHM_LINE)
    # the last matching line is the one lineinfile replaces
    assert not ts.fstab_has(f"{SHM_LINE}\ntmpfs /dev/shm tmpfs size=1G 0 0\n", SHM_LINE)
    assert not ts.fstab_has(None, SHM_LINE)
    items = managed(tmp_path)
    converge(tmp_path, items)
    (tmp_path / "fstab").write_text("proc /proc proc defaults 0 0\n")
    assert decide(tmp_path, read(tmp_path, items))["fstab"]
    assert not decide(tmp_path, read(tmp_path, items), shm=None)["fstab"]  # no CPU KV tier: fstab is left


def test_grub_and_runtime_changes(tmp_path: Path) -> None:
    items = managed(tmp_path)
    converge(tmp_path, items)
    todo = decide(tmp_path, read(tmp_path, items), kernel_cmdline=["hugepagesz=1G"])
    assert todo["grub"] == "write"
    (tmp_path / "grub.cfg").write_text("G\n")
    (tmp_path / "grub.cfg").chmod(0o644)
    assert decide(tmp_path, read(tmp_path, items), kernel_cmdline=["hugepagesz=1G"])["grub"] == ""
    assert decide(tmp_path, read(tmp_path, items))["grub"] == "remove"
    todo = decide(tmp_path, read(tmp_path, items), changes=["thp enabled: always -> madvise"])
    assert todo["apply"] and todo["changes"][-1] == "thp enabled: always -> madvise"
    f = FILTERS.FilterModule().filters()["host_tuning_decide"]
    plan = {"kernel_cmdline": [], "shm": None, "changes": ["x"]}
    assert not f(plan, items, read(tmp_path, items), str(tmp_path / "grub.cfg"), "G\n", False)["apply"]
