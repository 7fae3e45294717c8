"""The action plugins that carry an ARGUMENT_SPEC and their docs stay in step."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name", ["vllm_fleet_wait", "vllm_fleet_logcheck", "vllm_fleet_requests", "vllm_fleet_rollout_record"]
)
def test_ansible_doc_documents_exactly_the_action_plugin_arguments(name: str) -> None:
    result = subprocess.run(
        [str(BIN / "ansible-doc"), "-M", str(ROOT / "plugins/modules"), "--json", name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    documented = set(json.loads(result.stdout)[name]["doc"]["options"])
    code = set(_load(ROOT / "plugins/action" / f"{name}.py").ARGUMENT_SPEC)
    assert documented == code
