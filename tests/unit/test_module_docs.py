"""Every module of the collection is documented for ansible-doc: its DOCUMENTATION, EXAMPLES and RETURN parse
(one ansible-doc call for all). A plain YAML scalar with ': ' in it made vllm_fleet_host_state's documentation
unreadable, and `ansible-doc -l` still listed the module with its short description."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))


def test_ansible_doc_reads_every_module_whole() -> None:
    result = subprocess.run(
        [str(BIN / "ansible-doc"), "-M", str(ROOT / "plugins" / "modules"), "--json", *MODULES],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0 and "[ERROR]" not in result.stderr, result.stderr
    docs = json.loads(result.stdout)
    assert sorted(docs) == MODULES
    for name, entry in docs.items():
        assert entry["doc"]["options"], name
        assert entry["examples"] and entry["return"], name
