"""The callback vllm_fleet.serving.vllm_fleet_preload (issue 21): with it, the vllm_fleet library that the
collection's filters call is imported once, in ansible-playbook's own process; without it, the worker forked
for every task imports it again. Real ansible-playbook runs on localhost; a sitecustomize on PYTHONPATH adds
an audit hook (sys.addaudithook: forked workers inherit it) that logs the pid of each process that imports
the module, which neither a worker's stderr (ansible-core sends it elsewhere) nor its exit code would show."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TASKS = 3
# Three tasks that each name one of the collection's filters (a different one from the module counted below:
# ansible-core loads every filter file of a collection to find one filter)
PLAY = "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n" + "".join(
    f"    - name: Task {i}\n      ansible.builtin.debug:\n"
    f"        msg: \"{{{{ '/tmp/r' | vllm_fleet.serving.vllm_fleet_report_dir('plan') }}}}\"\n"
    for i in range(TASKS)
)


SITECUSTOMIZE = """\
import os, sys
def _log_import(event, args):
    # "import" is audited only when a module is not in sys.modules yet, i.e. really imported
    if event == "import" and args[0] == os.environ["PRELOAD_TEST_MODULE"]:
        with open(os.environ["PRELOAD_TEST_LOG"], "a") as log:
            log.write(f"{os.getpid()}\\n")
sys.addaudithook(_log_import)
"""


def imports_of(module: str, callbacks: str, tmp_path: Path) -> tuple[int, str]:
    """How many processes of one ansible-playbook run imported `module`, and the run's output."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "imports.log"
    (tmp_path / "play.yml").write_text(PLAY)
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n" + (f"callbacks_enabled = {callbacks}\n" if callbacks else ""))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO),  # the clone's ansible_collections/vllm_fleet/serving
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "PYTHONPATH": str(tmp_path / "site"),
        "PRELOAD_TEST_MODULE": module,
        "PRELOAD_TEST_LOG": str(log),
    }
    playbook = Path(sys.executable).parent / "ansible-playbook"
    run = subprocess.run(
        [str(playbook), "-i", "localhost,", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    pids = log.read_text().split() if log.exists() else []
    assert len(pids) == len(set(pids))  # once per process at most
    return len(pids), run.stdout


def test_with_the_callback_the_library_is_imported_once_for_every_task(tmp_path: Path) -> None:
    count, stdout = imports_of("vllm_fleet.verify.report", "vllm_fleet.serving.vllm_fleet_preload", tmp_path)
    assert stdout.count('"msg": "/tmp/r/plan"') == TASKS, stdout
    assert count == 1


def test_without_it_every_task_imports_the_library_again(tmp_path: Path) -> None:
    count, stdout = imports_of("vllm_fleet.verify.report", "", tmp_path)
    assert stdout.count('"msg": "/tmp/r/plan"') == TASKS, stdout
    assert count == TASKS


def test_it_loads_every_filter_and_action_plugin_of_the_collection() -> None:
    probe = (
        "import sys\n"
        "from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder\n"
        f"_AnsibleCollectionFinder(paths=[{str(REPO)!r}])._install()\n"
        "from ansible_collections.vllm_fleet.serving.plugins.callback import vllm_fleet_preload as p\n"
        "print('\\n'.join(p.preload_plugins()))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    prefix = "ansible_collections.vllm_fleet.serving.plugins"
    expected = {
        f"{prefix}.{kind}.{path.stem}"
        for kind in ("filter", "action")
        for path in (REPO / "plugins" / kind).glob("*.py")
    }
    assert set(run.stdout.split()) == expected


def test_at_the_playbook_start_it_freezes_what_workers_inherit() -> None:
    probe = (
        "import gc\n"
        "from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder\n"
        f"_AnsibleCollectionFinder(paths=[{str(REPO)!r}])._install()\n"
        "from ansible_collections.vllm_fleet.serving.plugins.callback import vllm_fleet_preload as p\n"
        "before = gc.get_freeze_count()\n"
        "p.CallbackModule().v2_playbook_on_start(None)\n"
        "print(before, gc.get_freeze_count())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    before, after = map(int, run.stdout.split())
    assert before == 0 and after > 10_000  # the library's objects among them
