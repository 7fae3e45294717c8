"""Every filter the plugins export is documented for ansible-doc (a sidecar `<filter>.yml` beside the plugin
file), and the documented options are the filter's real parameters: the first one is `_input`, the others are
named as in the signature, required exactly where the signature has no default, `positional` in the
signature's order. ansible-doc itself reads every sidecar (one call for all): a doc it cannot load fails."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# the collection's filter plugins (roles keep none: a collection role does not load its own filter_plugins)
FILTER_DIRS = [REPO / "plugins" / "filter", *sorted(REPO.glob("roles/*/filter_plugins"))]


def _exported() -> dict[str, tuple[Path, Any]]:
    """filter name -> (its plugin file, the function), for every FilterModule of every filter folder."""
    found: dict[str, tuple[Path, Any]] = {}
    for folder in FILTER_DIRS:
        for path in sorted(folder.glob("*.py")):
            spec = importlib.util.spec_from_file_location(f"{path.stem}_docs_under_test", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for name, func in module.FilterModule().filters().items():
                assert name not in found, f"{name} is exported by {found[name][0]} and {path}"
                found[name] = (path, func)
    return found


EXPORTED = _exported()


def test_the_plugins_export_the_filters_the_roles_use() -> None:
    # a floor, so that a loader that silently found nothing cannot pass the tests below
    assert len(EXPORTED) >= 39
    assert {"nvidia_driver_pin", "host_tuning_plan", "vllm_rollout_summary", "vllm_service_files"} <= set(
        EXPORTED
    )


def _doc(path: Path, name: str) -> dict[str, Any]:
    sidecar = path.parent / f"{name}.yml"
    assert sidecar.is_file(), f"filter {name} ({path.name}) has no ansible-doc sidecar {sidecar}"
    data = yaml.safe_load(sidecar.read_text())
    assert set(data) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, sidecar
    return data


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_every_filter_documents_its_real_parameters(name: str) -> None:
    path, func = EXPORTED[name]
    data = _doc(path, name)
    doc = data["DOCUMENTATION"]
    assert doc["name"] == name and doc["short_description"] and doc["description"]
    assert "_value" in data["RETURN"] and data["RETURN"]["_value"]["description"]
    assert f"vllm_fleet.serving.{name}" in data["EXAMPLES"], "the example calls the filter by its FQCN"
    params = list(inspect.signature(func).parameters.values())
    options = doc["options"]
    assert options["_input"].get("required") is True and options["_input"]["description"]
    named = {p.name: p for p in params[1:] if p.kind is not p.VAR_KEYWORD}
    documented = {k: v for k, v in options.items() if k != "_input"}
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    missing = set(named) - set(documented)
    assert not missing, f"{name}: parameters {sorted(missing)} are not documented"
    if not takes_kwargs:
        assert set(documented) == set(named), f"{name}: documents options it does not take"
    for option, spec in documented.items():
        assert spec["description"] and spec["type"], f"{name}.{option}"
        if option in named:
            required = named[option].default is inspect.Parameter.empty
            assert bool(spec.get("required")) is required, f"{name}.{option}: required is {required}"
    positional = [p.name for p in params[1:] if p.kind is p.POSITIONAL_OR_KEYWORD]
    written = [p.strip() for p in doc.get("positional", "").split(",") if p.strip()]
    assert written == positional, f"{name}: positional should be {positional}"


def test_the_roles_keep_no_filter_plugins() -> None:
    assert FILTER_DIRS == [REPO / "plugins" / "filter"]


def test_ansible_doc_loads_every_filter_doc_by_fqcn() -> None:
    # the clone's ansible.cfg: collections_path finds ansible_collections/vllm_fleet/serving (the repository)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    ansible_doc = Path(sys.executable).parent / "ansible-doc"
    out = subprocess.run(
        [str(ansible_doc), "-t", "filter", "--json", *(f"vllm_fleet.serving.{n}" for n in sorted(EXPORTED))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    docs = json.loads(out.stdout)
    for name in EXPORTED:
        entry = docs.get(f"vllm_fleet.serving.{name}")
        assert entry and entry["doc"]["options"]["_input"], f"ansible-doc shows no options for {name}"
        assert entry["doc"]["short_description"], name
