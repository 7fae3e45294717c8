"""`vllm-fleet render` and `vllm-fleet flags`: --json prints one object; exit 2 names the bad input."""

from __future__ import annotations

import json
import shlex

from test_render_support import FIXTURES, REPO, SEED_VARS, rtx4090_topology

from vllm_fleet.cli import main
from vllm_fleet.plan.layout import plan_layout


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_json_with_a_layout(capsys, tmp_path):
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(plan_layout(rtx4090_topology(), 4).to_dict()), encoding="utf-8")
    code, out, _ = _run(
        capsys,
        "render",
        "--vars",
        str(SEED_VARS),
        "--vllm-version",
        "0.33.0",
        "--instance-json",
        str(layout),
        "--instance",
        "i1",
        "--model-config",
        str(FIXTURES / "models/qwen3.6-27b.config.json"),
        "--json",
    )
    result = json.loads(out)
    assert code == 0, result["errors"]
    assert result["argv"][:3] == ["/usr/bin/numactl", "--cpunodebind=1", "--membind=1"]
    assert result["port"] == 8001
    assert result["exec_start"].startswith(
        "/usr/bin/numactl --cpunodebind=1 --membind=1 /opt/vllm-fleet/venv/bin/vllm"
    )
    assert set(result) >= {"argv", "exec_start", "warnings", "errors"}


def test_render_shell_for_0_10_2_reports_errors_and_exits_1(capsys):
    code, out, _ = _run(capsys, "render", "--vars", str(SEED_VARS), "--vllm-version", "0.10.2", "--shell")
    assert code == 1
    command = out.splitlines()[0]
    words = shlex.split(command)
    assert "--rope-scaling" in words
    assert (
        "error: vllm_service_kv_offload_cpu_bytes: the OffloadingConnector does not exist in vLLM 0.10.2"
        in out
    )


def test_render_bad_input_is_exit_2_naming_it(capsys, tmp_path):
    bad = tmp_path / "vars.yml"
    bad.write_text("vllm_service_model: /m\nvllm_service_max_num_seqs: lots\n", encoding="utf-8")
    code, _, err = _run(capsys, "render", "--vars", str(bad), "--vllm-version", "0.33.0")
    assert code == 2
    assert "vllm_service_max_num_seqs: 'lots' is not an integer" in err
    code, _, err = _run(
        capsys,
        "render",
        "--vars",
        str(REPO / "roles/vllm_service/defaults/main.yml"),
        "--vllm-version",
        "0.33.0",
    )
    assert code == 2 and "Jinja templates" in err


def test_flags_lookup_and_catalog(capsys):
    code, out, _ = _run(capsys, "flags", "--vllm-version", "0.33.0", "--flag", "rope-scaling", "--json")
    result = json.loads(out)
    assert code == 1 and result["exists"] is False
    assert result["releases"][-1] == "0.11.0"
    code, out, _ = _run(capsys, "flags", "--vllm-version", "0.33.0", "--json")
    catalog = json.loads(out)
    assert code == 0 and "--kv-cache-memory-bytes" in catalog["flags"]
    assert "0.8.5" in catalog["catalogued_versions"]


def test_flags_check_command_on_the_seed(capsys):
    code, out, _ = _run(
        capsys,
        "flags",
        "--vllm-version",
        "0.33.0",
        "--check-command",
        str(FIXTURES / "seed/seed-command.sh"),
        "--json",
    )
    result = json.loads(out)
    assert code == 1
    assert len(result["errors"]) == 4


def _unit_lines(text: str, *prefixes: str) -> list[str]:
    return [line.strip(" \\") for line in text.splitlines() if line.strip().startswith(prefixes)]


def test_render_unit_for_0_26_drains_and_waits_longer_than_the_drain(capsys):
    """vLLM 0.26.0 has --shutdown-timeout (catalog: since 0.19.0 among the sampled wheels): the unit's command
    carries it, and systemd's stop wait exceeds it by the teardown margin."""
    code, out, _ = _run(capsys, "render", "--vars", str(SEED_VARS), "--vllm-version", "0.26.0", "--unit")
    assert code == 0, out
    assert _unit_lines(out, "--shutdown-timeout") == ["--shutdown-timeout 600"]
    assert _unit_lines(out, "TimeoutStopSec=") == ["TimeoutStopSec=660"]


def test_render_unit_for_a_release_without_the_flag_gets_neither(capsys, tmp_path):
    """0.14.0's parser has no --shutdown-timeout: no flag (vLLM would refuse it), and no longer wait."""
    code, out, _ = _run(capsys, "render", "--vars", str(SEED_VARS), "--vllm-version", "0.14.0", "--unit")
    assert "--shutdown-timeout" not in out
    assert _unit_lines(out, "TimeoutStopSec=") == ["TimeoutStopSec=60"]
    # an explicit value does not force the flag onto a release without it
    variables = tmp_path / "vars.yml"
    variables.write_text(
        "vllm_service_model: /m\nvllm_service_host: 127.0.0.1\nvllm_service_shutdown_timeout: 30\n",
        encoding="utf-8",
    )
    code, out, _ = _run(capsys, "render", "--vars", str(variables), "--vllm-version", "0.14.0", "--unit")
    assert code == 0 and "--shutdown-timeout" not in out
    assert _unit_lines(out, "TimeoutStopSec=") == ["TimeoutStopSec=60"]
    code, out, _ = _run(capsys, "render", "--vars", str(variables), "--vllm-version", "0.32.0", "--unit")
    assert _unit_lines(out, "--shutdown-timeout") == ["--shutdown-timeout 30"]
    assert _unit_lines(out, "TimeoutStopSec=") == ["TimeoutStopSec=90"]


def test_shutdown_timeout_zero_is_vllms_abort_and_a_negative_one_is_refused(capsys, tmp_path):
    variables = tmp_path / "vars.yml"
    variables.write_text(
        "vllm_service_model: /m\nvllm_service_host: 127.0.0.1\nvllm_service_shutdown_timeout: 0\n",
        encoding="utf-8",
    )
    code, out, _ = _run(capsys, "render", "--vars", str(variables), "--vllm-version", "0.32.0", "--unit")
    assert code == 0 and "--shutdown-timeout" not in out
    assert _unit_lines(out, "TimeoutStopSec=") == ["TimeoutStopSec=60"]
    variables.write_text("vllm_service_model: /m\nvllm_service_shutdown_timeout: -5\n", encoding="utf-8")
    code, _, err = _run(capsys, "render", "--vars", str(variables), "--vllm-version", "0.32.0")
    assert code == 2 and "vllm_service_shutdown_timeout: -5" in err
