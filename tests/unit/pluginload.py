"""Load one of the collection's plugin files (plugins/filter/*.py, plugins/modules/*.py) as a module by path,
as ansible-core does, without the collection loader: what the unit tests of filters and modules call."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_plugin(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
