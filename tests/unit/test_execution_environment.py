"""execution-environment.yml (the project's image definition): `ansible-builder create` accepts it, and its
build context installs the wheel that `uv build` makes of this checkout, with the ansible-core lines
pyproject.toml supports. (meta/execution-environment.yml is the collection's own EE metadata:
test_collection.py introspects it.)

No image is built here (no container engine on the test machine): `create` is ansible-builder's own check of
the definition (schema, files it copies) and writes the Dockerfile that a build would run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from wheelvenv import uv_build

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ansible_builder_creates_a_context_that_installs_the_wheel(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "execution-environment.yml", project)
    built = uv_build("wheel", project / "dist", timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((project / "dist").glob("vllm_fleet-*.whl"))
    context = tmp_path / "context"
    created = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", str(context)],
        cwd=project, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout[-3000:] + created.stderr[-3000:]
    assert (context / "_build" / "wheels" / wheel.name).is_file()
    dockerfile = (context / "Dockerfile").read_text(encoding="utf-8")
    assert "pip install --no-cache-dir /tmp/vllm-fleet-wheels/*.whl" in dockerfile
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    core = next(p for p in pins if p.startswith("ansible-core"))
    assert core in dockerfile, f"the image's ansible-core is not pyproject's {core!r}"
