"""One read of the host per role (issue 21): the module vllm_fleet_host_state's readers, run on real files and
a real `systemctl show` text layout, and the filter vllm_fleet_drifted that compares them with the plan."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from pluginload import load_plugin

from vllm_fleet.deploy import filestate

REPO = Path(__file__).resolve().parents[2]


MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_host_state.py", "host_state_under_test")
FILTER = load_plugin(REPO / "plugins" / "filter" / "vllm_fleet_state.py", "state_filter_under_test")


def test_file_state_reads_stat_and_sha256(tmp_path: Path) -> None:
    f = tmp_path / "a.conf"
    f.write_text("kernel.numa_balancing = 0\n")
    f.chmod(0o640)
    got = MODULE.file_state(str(f))
    assert got["exists"] and got["type"] == "file" and got["mode"] == "0640"
    assert got["sha256"] == hashlib.sha256(b"kernel.numa_balancing = 0\n").hexdigest()
    assert MODULE.file_state(str(tmp_path))["type"] == "directory"
    assert MODULE.file_state(str(tmp_path / "none")) == {"exists": False}
    os.symlink(f, tmp_path / "l")
    assert MODULE.file_state(str(tmp_path / "l"))["type"] == "link"


def test_read_text_skips_missing(tmp_path: Path) -> None:
    (tmp_path / "d").write_text("abc\n")
    assert MODULE.read_text(str(tmp_path / "d")) == "abc\n"
    assert MODULE.read_text(str(tmp_path / "x")) is None


def test_parse_show_one_block_per_unit_in_order() -> None:
    # the layout of `systemctl show --property=... u1 u2` (systemd 252): blocks in the order asked
    text = (
        "ActiveState=active\nLoadState=loaded\nUnitFileState=enabled\nNeedDaemonReload=no\n\n"
        "ActiveState=inactive\nLoadState=not-found\nUnitFileState=\nNeedDaemonReload=no\n"
    )
    got = MODULE.parse_show(text, ["a.service", "b.service"])
    assert got["a.service"]["UnitFileState"] == "enabled"
    assert got["b.service"] == {
        "ActiveState": "inactive",
        "UnitFileState": "",
        "NeedDaemonReload": "no",
        "LoadState": "not-found",
    }


def test_drifted_is_empty_when_the_host_matches(tmp_path: Path) -> None:
    f = tmp_path / "s.conf"
    f.write_text("x = 1\n")
    f.chmod(0o644)
    files = {str(f): MODULE.file_state(str(f)), str(tmp_path): MODULE.file_state(str(tmp_path))}
    items = [
        {"path": str(f), "content": "x = 1\n", "mode": "0644"},
        {"path": str(tmp_path), "state": "directory", "mode": f"{tmp_path.stat().st_mode & 0o7777:04o}"},
    ]
    assert FILTER.vllm_fleet_drifted(items, {"files": files}) == []


@pytest.mark.parametrize(
    ("item", "why"),
    [
        ({"content": "x = 2\n"}, "content differs"),
        ({"content": "x = 1\n", "mode": "0600"}, "mode 0644, not 0600"),
        ({"content": "x = 1\n", "owner": "nobody-else"}, "owner"),
        ({"state": "directory"}, "is a file, not a directory"),
    ],
)
def test_drifted_names_each_difference(tmp_path: Path, item: dict, why: str) -> None:
    f = tmp_path / "s.conf"
    f.write_text("x = 1\n")
    f.chmod(0o644)
    got = filestate.drifted([{"path": str(f), **item}], {str(f): MODULE.file_state(str(f))})
    assert len(got) == 1 and got[0]["drift"].startswith(why)


def test_drifted_missing_file_and_errors(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")
    got = filestate.drifted([{"path": gone, "content": ""}], {gone: {"exists": False}})
    assert got[0]["drift"] == "missing"
    with pytest.raises(AnsibleFilterError, match="was not read on the host; add it to the paths"):
        FILTER.vllm_fleet_drifted([{"path": gone}], {"files": {}})
    with pytest.raises(AnsibleFilterError, match="pass path_key="):
        FILTER.vllm_fleet_drifted([{"dest": gone}], {"files": {}})


def test_commands_run_through_sh_with_their_status_output_and_a_missing_binary_as_127() -> None:
    got = MODULE.run_commands(
        {"ok": "printf 'a\\nb'", "fail": "echo no >&2; exit 3", "none": "no-such-binary-x"}
    )
    assert got["ok"] == {"rc": 0, "stdout": "a\nb", "stderr": ""}
    assert got["fail"]["rc"] == 3 and got["fail"]["stderr"] == "no\n"
    assert got["none"]["rc"] == 127


def test_files_cut_at_the_read_limit_are_flagged_for_read_and_globs(tmp_path: Path) -> None:
    small, big = tmp_path / "a.json", tmp_path / "b.json"
    small.write_text('{"name": "a"}')
    big.write_text("x" * (MODULE.READ_LIMIT + 1))
    globbed = MODULE.globbed_texts([str(tmp_path / "*.json")])
    assert len(globbed[str(tmp_path / "*.json")][str(big)]) == MODULE.READ_LIMIT
    contents = {str(small): MODULE.read_text(str(small))}
    assert MODULE.truncated_paths(contents, globbed) == [str(big)]
    assert MODULE.truncated_paths(contents, {}) == []
    contents[str(big)] = MODULE.read_text(str(big))
    assert MODULE.truncated_paths(contents, {}) == [str(big)]
