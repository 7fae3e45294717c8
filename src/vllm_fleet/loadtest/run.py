"""What one load-test run does, decided on the controller from the instance plans the hosts hold: the URL
it loads, the /metrics it reads before and after, the client's vLLM and tokenizer, the key file, the script.

The role reads the plans on every host of the play (the ones vllm_service wrote), this module turns them into
endpoints and the run, and the role only runs what it is given (the trace file, the scrapes, the script).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.loadtest.command import BenchTarget, bench_argv, bench_script, key_lines, vllm_binary
from vllm_fleet.loadtest.report import Slo
from vllm_fleet.loadtest.workload import Workload, finite, workload_from_vars, workload_trace
from vllm_fleet.monitoring.targets import scrape_address
from vllm_fleet.plan.host import InstancePlan

API_KEY_ENV = "VLLM_API_KEY"


@dataclass(frozen=True)
class Endpoint:
    """One deployed instance as the load test reaches it (from its plan on the host)."""

    host: str
    instance: str
    base_url: str  # as other hosts reach it: the host's address for a wildcard --host
    served_model_name: str
    model_path: str
    vllm_bin: str
    max_model_len: int | None
    env_file: str  # its EnvironmentFile, which holds VLLM_API_KEY when it has a key
    has_api_key: bool

    @property
    def key(self) -> str:
        return f"{self.host}/{self.instance}"


def endpoint_of(plan: InstancePlan, host_address: str, config_dir: str) -> Endpoint:
    return Endpoint(
        host=plan.host,
        instance=plan.name,
        base_url=f"http://{scrape_address(plan, host_address)}",
        served_model_name=plan.served_model_name,
        model_path=plan.model,
        vllm_bin=vllm_binary(plan.argv),
        max_model_len=plan.max_model_len,
        env_file=f"{config_dir.rstrip('/')}/{plan.name}.env",
        has_api_key=API_KEY_ENV in plan.secret_env_names,
    )


def host_endpoints(plans: Sequence[Mapping[str, Any]], host_address: str, config_dir: str) -> list[dict]:
    """The endpoints of one host's plans (verify reads the same `<config_dir>/*.json`), by instance."""
    endpoints = [
        endpoint_of(
            InstancePlan.from_dict(p, where=f"instance plan in {config_dir}"), host_address, config_dir
        )
        for p in plans
    ]
    return [asdict(e) for e in sorted(endpoints, key=lambda e: e.instance)]


@dataclass(frozen=True)
class Settings:
    """The role's variables other than the workload's, read once (fleet_loadtest_*)."""

    name: str
    url: str
    instance: str
    api_key_file: str
    api_key_variable: str
    timeout_s: int
    slo: Slo


def _mark(variables: Mapping[str, Any], name: str, *, whole: bool = False) -> float | None:
    """An SLO mark; 0 means "not judged" for the marks whose 0 would be meaningless (P99, minimums)."""
    value = variables.get(name, 0)
    if not finite(value) or value < 0:
        raise FleetInputError(f"{name} is {value!r}; give a number >= 0 (0: not judged)")
    if whole and int(value) != value:
        raise FleetInputError(f"{name} is {value!r}; give a whole number")
    return float(value) if value else None


def _count(variables: Mapping[str, Any], name: str) -> int:
    value = variables.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FleetInputError(f"{name} is {value!r}; give a whole number >= 0")
    return value


def slo_from_vars(variables: Mapping[str, Any]) -> Slo:
    rate_min = _mark(variables, "fleet_loadtest_slo_prefix_hit_rate_min")
    acceptance_min = _mark(variables, "fleet_loadtest_slo_spec_acceptance_min")
    for name, value in (
        ("fleet_loadtest_slo_prefix_hit_rate_min", rate_min),
        ("fleet_loadtest_slo_spec_acceptance_min", acceptance_min),
    ):
        if value is not None and value > 1:
            raise FleetInputError(f"{name} is {value!r}; a rate lies between 0 and 1 (0.5 is 50 %)")
    return Slo(
        ttft_p99_max_ms=_mark(variables, "fleet_loadtest_slo_ttft_p99_max_ms"),
        failed_max=_count(variables, "fleet_loadtest_slo_failed_max"),
        truncated_max=_count(variables, "fleet_loadtest_slo_truncated_max"),
        prefix_hit_rate_min=rate_min,
        spec_acceptance_min=acceptance_min,
    )


def settings_from_vars(variables: Mapping[str, Any]) -> Settings:
    timeout = variables.get("fleet_loadtest_timeout", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 10 <= timeout <= 86400:
        raise FleetInputError(
            f"fleet_loadtest_timeout is {timeout!r}; give the run's bound in seconds, from 10 to 86400"
        )
    name = str(variables.get("fleet_loadtest_name") or "")
    # one file name (the report, its folder of raw files, the scratch folder the run removes after it)
    if not re.fullmatch(r"[A-Za-z0-9._-]{0,200}", name) or name.startswith("."):
        raise FleetInputError(
            f"fleet_loadtest_name {name!r} names the report file; use letters, digits, '.', '_' and '-' "
            "(not leading '.', at most 200), or '' for <UTC time>-<workload digest>"
        )
    return Settings(
        name=name,
        url=str(variables.get("fleet_loadtest_url") or "").rstrip("/"),
        instance=str(variables.get("fleet_loadtest_instance") or ""),
        api_key_file=str(variables.get("fleet_loadtest_api_key_file") or ""),
        api_key_variable=str(variables.get("fleet_loadtest_api_key_variable") or ""),
        timeout_s=timeout,
        slo=slo_from_vars(variables),
    )


def variable_error(variable: str, value: Any, variables: Mapping[str, Any]) -> FleetInputError | None:
    """The refusal of `variable` (set to `value` among the host's `variables`) by the checks a run makes
    before any request: vllm_fleet.validate calls it in preflight, so the rule stays here, in one place.
    Only a refusal that names `variable` is its own; another variable's is reported under that one."""
    given = {**variables, variable: value}
    try:
        workload_from_vars(given)
        settings = settings_from_vars(given)
        key_lines(settings.api_key_file or "/dev/null", settings.api_key_variable)
    except FleetInputError as exc:
        if re.match(rf"{re.escape(variable)}\b", str(exc)):
            return exc
    return None


def pick_endpoint(endpoints: Sequence[Endpoint], instance: str, host: str) -> Endpoint:
    """The client host's instance that the run targets (the named one, or its first)."""
    if not endpoints:
        raise FleetInputError(
            f"no instance plan on {host}, the load test's client: it runs `vllm bench serve` from a deployed "
            "vLLM host; deploy first (playbooks/deploy.yml) or put a vLLM host first in the play"
        )
    if not instance:
        return endpoints[0]
    for endpoint in endpoints:
        if endpoint.instance == instance:
            return endpoint
    raise FleetInputError(
        f"fleet_loadtest_instance {instance!r} is not an instance on {host} "
        f"({', '.join(e.instance for e in endpoints)}); name one of them or leave it empty for the first"
    )


def check_lengths(workload: Workload, endpoints: Sequence[Endpoint]) -> None:
    """Refuse a mode longer than every instance that could serve it: vLLM would fail each such request."""
    lengths = [e.max_model_len for e in endpoints if e.max_model_len]
    if not lengths:
        return
    longest = max(lengths)
    for index, mode in enumerate(workload.modes):
        if mode.input_tokens + mode.output_tokens > longest:
            raise FleetInputError(
                f"fleet_loadtest_mix[{index}] ({mode.name}): {mode.input_tokens} + {mode.output_tokens} "
                f"tokens exceed the longest max_model_len of the instances under load ({longest}); "
                "shorten the mode or load instances that hold it"
            )


def key_file_of(settings: Settings, target: Endpoint) -> tuple[str, str]:
    """(file, variable) the API key is read from on the client: the named file, else the target instance's
    EnvironmentFile when its plan has a key ("none": send no key)."""
    if settings.api_key_file == "none":
        return "", ""
    if settings.api_key_file:
        return settings.api_key_file, settings.api_key_variable
    if target.has_api_key:
        return target.env_file, API_KEY_ENV
    return "", ""


def run_name(settings: Settings, workload: Workload, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return settings.name or f"{stamp}-{workload.digest[:8]}"


def plan_run(
    endpoints_by_host: Mapping[str, Sequence[Mapping[str, Any]]],
    client: str,
    variables: Mapping[str, Any],
    workdir: str,
) -> dict[str, Any]:
    """The run: its name, target URL, the /metrics to read (key -> URL), the trace file's text and the
    script the client runs in `<workdir>/<name>`. Every variable is checked before anything runs."""
    workload = workload_from_vars(variables)
    settings = settings_from_vars(variables)
    mine = [Endpoint(**e) for e in endpoints_by_host.get(client, [])]
    target = pick_endpoint(mine, settings.instance, client)
    if settings.url:
        # behind a gateway: every instance of the play takes part of the load
        loaded = [Endpoint(**e) for host in sorted(endpoints_by_host) for e in endpoints_by_host[host]]
    else:
        loaded = [target]
    check_lengths(workload, loaded)
    url = settings.url or target.base_url
    name = run_name(settings, workload)
    workdir = f"{workdir.rstrip('/')}/{name}"
    argv = bench_argv(
        BenchTarget(url, target.served_model_name, target.model_path, target.vllm_bin),
        workload,
        workdir,
        settings.timeout_s,
    )
    key_file, key_variable = key_file_of(settings, target)
    return {
        "name": name,
        "url": url,
        "client": client,
        "metrics": {e.key: f"{e.base_url}/metrics" for e in loaded},
        "trace": workload_trace(workload),
        "script": bench_script(argv, workload.seed, key_file, key_variable),
        "workdir": workdir,
        "timeout_s": settings.timeout_s,
    }
