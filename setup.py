"""The wheel also ships the Ansible collection vllm_fleet.serving as ansible_collections/vllm_fleet/serving/,
so ansible-core finds it on sys.path after a plain `pip install` (no clone, no ansible-galaxy). The clone's
ansible_collections/vllm_fleet/serving is a symlink to the repository root, which setuptools cannot package
as such: this build step copies the collection's files (the ones `ansible-galaxy collection build` packs, see
tests/unit/test_collection.py) into the build tree. Everything else is declared in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COLLECTION = ("ansible_collections", "vllm_fleet", "serving")
# what galaxy.yml's build_ignore leaves in the Galaxy artifact (the test compares the two file lists)
FILES = ("galaxy.yml", "README.md", "LICENSE", "CHANGELOG.md", "site.yml", "requirements.txt", "bindep.txt")
FOLDERS = ("meta", "plugins", "roles", "playbooks", "docs")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


class BuildPyWithCollection(build_py):
    def run(self) -> None:
        super().run()
        # an editable install runs from the clone, whose ansible.cfg already finds the collection
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib).joinpath(*COLLECTION)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in FILES:
            shutil.copy2(ROOT / name, target / name)
        for name in FOLDERS:
            shutil.copytree(ROOT / name, target / name, ignore=SKIP)


setup(cmdclass={"build_py": BuildPyWithCollection})
