"""The module vllm_fleet_files (vllm_service's unit, plan, environment file and applied digest, one call per
task instead of a stat, a transfer and a copy per file: issue 32) on real files: it writes only what differs
in content, mode or owner, replaces a file whole, gives a diff where the content changes and writes nothing in
check mode; and the items vllm_service hands it (vllm_fleet.deploy.filestate.file_writes and
service.digest_items). The suite runs as root (the labs need it), so the files are really chowned to root."""

from __future__ import annotations

from pathlib import Path

import pytest
from pluginload import load_plugin

from vllm_fleet.deploy import filestate
from vllm_fleet.deploy.service import digest_items

REPO = Path(__file__).resolve().parents[2]
MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_files.py", "files_under_test")
UNIT = (
    "[Unit]\nDescription=vLLM instance i0 (vllm-fleet)\n[Service]\nExecStart=/usr/bin/numactl -- vllm serve\n"
)


def spec(path: Path, content: str, mode: str = "0644") -> dict[str, str]:
    return {"path": str(path), "content": content, "mode": mode, "owner": "root", "group": "root"}


def test_writes_what_differs_once_with_a_diff_where_the_content_changes(tmp_path: Path) -> None:
    unit, plan = tmp_path / "vllm-fleet-i0.service", tmp_path / "i0.json"
    files = [spec(unit, UNIT), spec(plan, '{"instance": "i0"}\n')]
    assert MODULE.write_files(files, check_mode=True)[0] == [str(unit), str(plan)] and not unit.exists()
    written, diffs = MODULE.write_files(files)
    assert written == [str(unit), str(plan)] and [d["before"] for d in diffs] == ["", ""]
    assert unit.read_text() == UNIT and oct(unit.stat().st_mode & 0o7777) == "0o644"
    assert MODULE.write_files(files) == ([], [])
    # a changed serve command: a diff of the whole text; a mode changed by hand: written, no diff
    changed = UNIT.replace("vllm serve", "vllm serve --max-model-len 128")
    plan.chmod(0o600)
    written, diffs = MODULE.write_files([spec(unit, changed), spec(plan, '{"instance": "i0"}\n')])
    assert written == [str(unit), str(plan)]
    assert diffs == [
        {"before_header": str(unit), "after_header": str(unit), "before": UNIT, "after": changed}
    ]
    assert oct(plan.stat().st_mode & 0o7777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i0.json", "vllm-fleet-i0.service"]


def test_the_items_vllm_service_hands_it_carry_only_what_it_takes() -> None:
    item = {
        "path": "/etc/vllm-fleet/i0.json",
        "content": "{}",
        "owner": "root",
        "group": "root",
        "mode": "0644",
    }
    extra = {
        "kind": "plan",
        "name": "i0",
        "unit_name": "vllm-fleet-i0.service",
        "drift": "missing",
        "state": "file",
    }
    assert filestate.file_writes([item | extra]) == [item]
    with pytest.raises(Exception, match="no path or content for /d"):
        filestate.file_writes([{"path": "/d", "state": "directory"}])
    files = [
        {"name": "i0", "digest": "ab" * 32, "digest_path": "/var/lib/vllm-fleet/applied/i0"},
        {"name": "i1", "digest": "cd" * 32, "digest_path": "/var/lib/vllm-fleet/applied/i1"},
    ]
    (digest,) = digest_items(files, ["i1"])
    assert digest == {"path": "/var/lib/vllm-fleet/applied/i1", "content": "cd" * 32 + "\n"} | {
        "owner": "root",
        "group": "root",
        "mode": "0600",
    }
