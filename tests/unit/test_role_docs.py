"""Each role documents itself the way ansible-doc and Galaxy show it: its meta/argument_specs.yml gives every
variable of defaults/main.yml with that very default, and the role has a README.md naming its variables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
# Set by the playbook or by `vllm-fleet rollout` per run (named in the role's README), not role settings:
NOT_IN_SPEC = {
    "vllm_rollout": {
        "vllm_rollout_hosts",
        "vllm_rollout_canary",
        "vllm_rollout_serial",
        "vllm_rollout_report_dir",
        "vllm_rollout_run_id",
    }
}


# A secret whose default is another secret: its spec default stays empty, because Ansible returns the spec,
# its defaults templated, in the result of a failed validation (`argument_spec_data`), which is printed, and
# no_log masks the given value only.
SECRET_FROM_ANOTHER = {"vllm_verify": {"vllm_verify_api_key"}, "fleet_gateway": {"fleet_gateway_api_key"}}


def _spec(role: str) -> dict:
    data = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    return data["argument_specs"]["main"]["options"]


def _defaults(role: str) -> dict:
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}


@pytest.mark.parametrize("role", [r for r in ROLES if r != "fleet_monitoring"])
def test_argument_spec_gives_each_default_as_defaults_main_sets_it(role: str) -> None:
    spec, defaults = _spec(role), _defaults(role)
    missing = sorted(set(defaults) - set(spec) - NOT_IN_SPEC.get(role, set()))
    assert not missing, f"roles/{role}: in defaults/main.yml but not in meta/argument_specs.yml: {missing}"
    secrets = SECRET_FROM_ANOTHER.get(role, set())
    differs = {
        name: (spec[name].get("default", "<none>"), value)
        for name, value in defaults.items()
        if name in spec and name not in secrets and spec[name].get("default", "<none>") != value
    }
    assert not differs, f"roles/{role}: argument spec default vs defaults/main.yml: {differs}"
    assert all(spec[name].get("default") == "" for name in secrets), {n: spec[n] for n in secrets}


@pytest.mark.parametrize("role", ROLES)
def test_no_secret_has_a_templated_default_in_its_spec(role: str) -> None:
    """A failed validation prints the spec with its defaults templated: a no_log option whose default is a
    template (vllm_verify_api_key's was vllm_service_api_key) printed that secret."""
    templated = [
        name
        for name, option in _spec(role).items()
        if option.get("no_log") and "{{" in str(option.get("default", ""))
    ]
    assert not templated, f"roles/{role}: no_log options with a templated spec default: {templated}"


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_a_readme(role: str) -> None:
    assert (ROOT / "roles" / role / "README.md").is_file(), f"roles/{role}/README.md is missing"


def test_readme_variable_tables_are_the_argument_specs() -> None:
    # fleet_monitoring's README is its owner's (issue 17) until its table is written in
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "role_variables.py"), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tabled = [r for r in ROLES if role_variables_begin() in (ROOT / "roles" / r / "README.md").read_text()]
    assert sorted(set(ROLES) - set(tabled)) == ["fleet_monitoring"]


def role_variables_begin() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    import role_variables

    return role_variables.BEGIN


def test_the_table_is_the_spec_and_replaces_the_old_one() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import role_variables

    spec = "argument_specs:\n  main:\n    options:\n      r_a: {type: int, default: 3, description: A | b.}\n"
    table = role_variables.variables_table(spec)
    assert table.splitlines()[-1] == "| `r_a` | int | `3` | A \\| b. |"
    once = role_variables.with_table("# r\n", "old")
    assert (
        role_variables.with_table(once, table)
        == f"# r\n\n## Variables\n\n{role_variables.BEGIN}\n{table}\n{role_variables.END}\n"
    )
