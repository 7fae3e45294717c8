"""The kind of every role variable, declared once.

The argument specs (roles/*/meta/argument_specs.yml) give each variable its type; ansible-lint's schema for
them admits no extra key (`schema[role-arg-spec]`: "Additional properties are not allowed ('kind' was
unexpected)"; ansible-core 2.19 itself ignores one), so the kind lives here, keyed by variable name, and
tests/unit/test_variable_kinds.py checks that every option of every argument spec has one, and no kind names a
variable no spec has.

`PORTS` is the one list of the port variables that must differ on a host (vLLM's first port, the exporters,
the gateway): a new listener is one line there.
"""

from __future__ import annotations

from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.validate import kinds, policy
from vllm_fleet.validate.kinds import Context, Kind

# ------------------------------------------------------------------------------------------ the kinds

ACCEPTED = Kind("accepted", kinds.accepted)  # a bool, a choice, the plan: the argument spec's check suffices
# read and checked as a whole by ServeSpec (render/schema.py) when the plan renders the serve command
SERVE = Kind("serve-spec", kinds.accepted)
CONTROLLER = Kind("controller-path", kinds.controller_path, optional=True)
LINE = Kind("line", kinds.line)
SECRET = Kind("secret", kinds.secret_line, optional=True)
PORT = Kind("port", kinds.port)
OPTIONAL_PORT = Kind("port", kinds.port, optional=True)
USER = Kind("user", kinds.user)
URL = Kind("url", kinds.url(("http", "https")))
OPTIONAL_URL = Kind("url", kinds.url(("http", "https")), optional=True)
APT_URL = Kind("url", kinds.url(("http", "https", "file")), optional=True)
PIP_VERSION = Kind("pip-version", kinds.pip_version)
DEB_VERSION = Kind("deb-version", kinds.deb_version)
DURATION = Kind("duration", kinds.duration)
FRACTION = Kind("fraction", kinds.number(0, 1))
SHARE = Kind("fraction", kinds.number(0, 1, above=True))
SECONDS = Kind("seconds", kinds.number(1, 86400, integer=True))
SECONDS_OR_ZERO = Kind("seconds", kinds.number(0, 86400, integer=True))
SHORT_SECONDS = Kind("seconds", kinds.number(1, 3600, integer=True))
LATENCY = Kind("seconds", kinds.number(0, 3600))
COUNT = Kind("count", kinds.number(0, 10000, integer=True))
POSITIVE_COUNT = Kind("count", kinds.number(1, 10000, integer=True))
TOKENS = Kind("tokens", kinds.size(2**31 - 1, human=True), optional=True)
BYTES = Kind("bytes", kinds.size(2**50), optional=True)  # 1 PiB: beyond any host's memory
HOST_PATH = Kind("path", kinds.path())
APT_KEYRINGS = ("/etc/apt/keyrings", "/usr/share/keyrings", "/etc/apt/trusted.gpg.d")


def writable(role: str, example: str, *, optional: bool = False) -> Kind:
    """A directory the role writes or owns: never a system directory as a whole unless opted in."""
    return Kind("path", kinds.path(example, opt_in=f"{role}_allow_system_paths"), optional=optional)


def rollout_serial(value: Any) -> None:
    """vllm_rollout_serial as the rollout reads it. Imported here, not at the top: validate runs before the
    plan, rollout after it, and only this one parser is shared."""
    from vllm_fleet.rollout.decisions import parse_serial

    parse_serial(value)


def instance_set(value: Any, variable: str, context: Context) -> None:
    """vllm_service_instance_set as the gateway reads it (the backend's name in haproxy.cfg)."""
    from vllm_fleet.gateway.sets import check_set_name

    check_set_name(value, context.own_addresses[0] if context.own_addresses else "this host")


def gateway_listen(value: Any, variable: str, context: Context) -> None:
    """An address (or '' for every interface) that HAProxy binds; beyond loopback only with a key or
    fleet_gateway_allow_unauthenticated, by the gateway's own rule (GatewaySettings)."""
    from vllm_fleet.gateway.haproxy import GatewaySettings

    if value != "":
        kinds.address(value, variable, context)
    GatewaySettings(
        listen_address=str(value),
        keyed=bool(context.variables.get("fleet_gateway_api_key")),
        allow_unauthenticated=policy.opted_in(context, "fleet_gateway_allow_unauthenticated"),
    )


def gateway_check_fast_interval(value: Any, variable: str, context: Context) -> None:
    """Seconds (0: the check interval), at most fleet_gateway_check_interval, by the gateway's own rule
    (GatewaySettings). An interval that is itself wrong is its own kind's to report."""
    from vllm_fleet.gateway.haproxy import GatewaySettings

    kinds.number(0, 3600, integer=True)(value, variable, context)
    interval = context.variables.get("fleet_gateway_check_interval", GatewaySettings.check_interval_s)
    try:
        kinds.number(1, 3600, integer=True)(interval, "fleet_gateway_check_interval", context)
    except FleetInputError:
        return
    GatewaySettings(check_interval_s=int(float(interval)), check_fast_interval_s=int(float(value)))


def loadtest_setting(value: Any, variable: str, context: Context) -> None:
    """A variable the load test's run plan checks before any request (vllm_fleet.loadtest.run): its rule,
    run here over the host's other loadtest variables."""
    from vllm_fleet.loadtest.run import variable_error

    error = variable_error(variable, value, context.variables)
    if error is not None:
        raise error


def api_key_file(value: Any, variable: str, context: Context) -> None:
    """'' (the instance's EnvironmentFile), 'none' (no key) or a file on the client."""
    if value not in ("", "none"):
        kinds.path("/etc/vllm-fleet/i0.env")(value, variable, context)


def listed(kind: Kind) -> Kind:
    return Kind(f"list of {kind.name}", kinds.each(kind))


# The port variables that must differ on one host: what listens there. vLLM's instances take
# vllm_service_port and the next ones (the plan's layout); the exporters and the gateway one each.
PORTS: dict[str, str] = {
    "vllm_service_port": "vLLM (the first instance; the others take the next ports)",
    "fleet_monitoring_node_exporter_port": "the node exporter",
    "fleet_monitoring_gpu_exporter_port": "the GPU exporter",
    # on the gateway group's hosts; checked on every host, as a gateway may share a vLLM host
    "fleet_gateway_port": "the gateway (HAProxy)",
}
DEFAULT_PORTS = {"vllm_service_port": 8000}
LOADTEST = Kind("loadtest-run", loadtest_setting)

# ------------------------------------------------------------------------------------------ the table

VARIABLES: dict[str, Kind] = {
    # cuda_toolkit
    "cuda_toolkit_enabled": ACCEPTED,
    "cuda_toolkit_version": Kind("cuda-release", kinds.cuda_release),
    "cuda_toolkit_force": ACCEPTED,
    "cuda_toolkit_hold": ACCEPTED,
    "cuda_toolkit_profile": ACCEPTED,
    # fleet_monitoring
    "fleet_monitoring_exporters": ACCEPTED,
    "fleet_monitoring_server": ACCEPTED,
    "fleet_monitoring_allow_system_paths": ACCEPTED,
    "fleet_monitoring_deb_dir": CONTROLLER,
    "fleet_monitoring_prometheus_version": DEB_VERSION,
    "fleet_monitoring_node_exporter_version": DEB_VERSION,
    "fleet_monitoring_deb_cache": writable("fleet_monitoring", "/var/cache/vllm-fleet-monitoring/debs"),
    "fleet_monitoring_node_exporter_port": PORT,
    "fleet_monitoring_node_exporter_args": Kind("args-line", kinds.args_line),
    "fleet_monitoring_gpu_exporter": ACCEPTED,
    "fleet_monitoring_gpu_exporter_wheelhouse": CONTROLLER,
    "fleet_monitoring_gpu_exporter_version": PIP_VERSION,
    "fleet_monitoring_gpu_exporter_venv": writable("fleet_monitoring", "/opt/vllm-fleet/gpu-exporter"),
    "fleet_monitoring_gpu_exporter_port": PORT,
    "fleet_monitoring_inventory": CONTROLLER,
    "fleet_monitoring_facts_dir": CONTROLLER,
    "fleet_monitoring_generated_dir": CONTROLLER,
    "fleet_monitoring_plan_dir": CONTROLLER,
    "fleet_monitoring_scrape_interval": DURATION,
    "fleet_monitoring_ttft_p99_max": Kind("seconds", kinds.number(0, 3600, above=True)),
    "fleet_monitoring_kv_usage_max": SHARE,
    "fleet_monitoring_prefix_hit_rate_min": FRACTION,
    "fleet_monitoring_alert_for": DURATION,
    "fleet_monitoring_down_for": DURATION,
    "fleet_monitoring_listen_address": Kind("listen", kinds.listen),
    "fleet_monitoring_dashboard_dir": writable("fleet_monitoring", "/var/lib/vllm-fleet-monitoring/grafana"),
    # fleet_gateway
    "fleet_gateway_allow_system_paths": ACCEPTED,
    "fleet_gateway_allow_unauthenticated": ACCEPTED,
    "fleet_gateway_deb_dir": CONTROLLER,
    "fleet_gateway_haproxy_version": DEB_VERSION,
    "fleet_gateway_deb_cache": writable("fleet_gateway", "/var/cache/vllm-fleet-gateway/debs"),
    "fleet_gateway_listen_address": Kind("gateway-listen", gateway_listen),
    "fleet_gateway_port": PORT,
    "fleet_gateway_api_key": SECRET,
    # haproxy.cfg's `stats socket PATH ...` (a space would add keywords); HAProxy replaces the file there
    "fleet_gateway_runtime_socket": Kind(
        "path",
        kinds.path("/run/haproxy/admin.sock", under=("/run", "/var/run", "/var/lib/haproxy"), spaces=False),
    ),
    "fleet_gateway_check_interval": SHORT_SECONDS,
    "fleet_gateway_check_fast_interval": Kind("seconds", gateway_check_fast_interval),
    "fleet_gateway_ready_timeout": SECONDS_OR_ZERO,
    "fleet_gateway_server_timeout": SECONDS,
    # UTF-8 text runs 1-4 bytes a character, a token a few characters: 64 is far beyond any tokenizer
    "fleet_gateway_bytes_per_token": Kind("bytes", kinds.number(0, 64, above=True)),
    "fleet_gateway_margin": Kind("fraction", kinds.number(0, 1, below=True)),  # 1 would leave 0 bytes
    "fleet_gateway_inventory": CONTROLLER,
    "fleet_gateway_plan_dir": CONTROLLER,
    "fleet_gateway_facts_dir": CONTROLLER,
    "fleet_gateway_generated_dir": CONTROLLER,
    # fleet_loadtest: LOADTEST is the run plan's own check (vllm_fleet.loadtest.run), run here as well
    "fleet_loadtest_allow_system_paths": ACCEPTED,
    "fleet_loadtest_name": LOADTEST,
    "fleet_loadtest_url": OPTIONAL_URL,
    "fleet_loadtest_instance": Kind("file-name", kinds.file_name, optional=True),  # a plan's name (i0)
    "fleet_loadtest_client": Kind("inventory-host", kinds.inventory_host, optional=True),
    "fleet_loadtest_mix": LOADTEST,
    "fleet_loadtest_num_requests": LOADTEST,
    "fleet_loadtest_max_concurrency": LOADTEST,
    "fleet_loadtest_request_rate": LOADTEST,
    "fleet_loadtest_prefix_share": LOADTEST,
    "fleet_loadtest_prefix_tokens": LOADTEST,
    "fleet_loadtest_seed": LOADTEST,
    "fleet_loadtest_timeout": LOADTEST,
    "fleet_loadtest_api_key_file": Kind("key-file", api_key_file),
    "fleet_loadtest_api_key_variable": LOADTEST,
    "fleet_loadtest_slo_ttft_p99_max_ms": LOADTEST,
    "fleet_loadtest_slo_failed_max": LOADTEST,
    "fleet_loadtest_slo_truncated_max": LOADTEST,
    "fleet_loadtest_slo_prefix_hit_rate_min": LOADTEST,
    "fleet_loadtest_slo_spec_acceptance_min": LOADTEST,
    "fleet_loadtest_fail": ACCEPTED,
    "fleet_loadtest_config_dir": HOST_PATH,  # read only (the instance plans)
    # the run's scratch folder <workdir>/<name> is removed after the run
    "fleet_loadtest_workdir": writable("fleet_loadtest", "/var/tmp/vllm-fleet-loadtest"),
    "fleet_loadtest_report_dir": CONTROLLER,
    "fleet_loadtest_keep_raw": ACCEPTED,
    # gpu_topology
    "gpu_topology_recorded_dir": CONTROLLER,
    "gpu_topology_tensor_parallel_size": Kind("count", kinds.number(1, 1024, integer=True), optional=True),
    "gpu_topology_model_config": ACCEPTED,
    "gpu_topology_vllm_version": Kind("pip-version", kinds.pip_version, optional=True),
    "gpu_topology_base_port": OPTIONAL_PORT,
    "gpu_topology_plan_layout": ACCEPTED,
    "gpu_topology_show_report": ACCEPTED,
    # host_tuning
    "host_tuning_host_plan": ACCEPTED,
    "host_tuning_hugepages": ACCEPTED,
    "host_tuning_shm_huge": ACCEPTED,
    "host_tuning_hugepage_size": ACCEPTED,
    "host_tuning_hugepages_margin": Kind("fraction", kinds.number(0, 10)),  # extra pages over the need
    "host_tuning_hugepages_max_node_fraction": SHARE,
    "host_tuning_hugepages_strict": ACCEPTED,
    "host_tuning_thp_enabled": ACCEPTED,
    "host_tuning_thp_defrag": ACCEPTED,
    "host_tuning_numa_balancing": ACCEPTED,
    "host_tuning_cpu_governor": Kind("governor", kinds.governor),
    "host_tuning_memlock_user": USER,
    "host_tuning_apply_runtime": ACCEPTED,
    "host_tuning_reboot": ACCEPTED,
    "host_tuning_grub_dropin": Kind(
        "path",
        kinds.path("/etc/default/grub.d/90-vllm-fleet.cfg", under=("/etc/default/grub.d",), suffix=".cfg"),
    ),
    # nvidia_driver
    "nvidia_driver_mode": ACCEPTED,
    "nvidia_driver_branch": Kind("driver-branch", kinds.driver_branch),
    "nvidia_driver_version": Kind("driver-version", kinds.driver_version, optional=True),
    "nvidia_driver_open": ACCEPTED,
    "nvidia_driver_source": ACCEPTED,
    "nvidia_driver_packages": listed(Kind("deb-package", kinds.deb_package)),
    "nvidia_driver_expected_gpu_count": Kind("count", kinds.number(0, 1024, integer=True)),
    "nvidia_driver_force": ACCEPTED,
    "nvidia_driver_reboot": ACCEPTED,
    "nvidia_driver_reboot_timeout": SECONDS,
    "nvidia_driver_manage_repo": ACCEPTED,
    "nvidia_driver_repo_base_url": Kind("url", kinds.url(("http", "https", "file"))),
    "nvidia_driver_repo_key_url": OPTIONAL_URL,
    "nvidia_driver_repo_key_file": CONTROLLER,
    "nvidia_driver_repo_key_fingerprint": Kind("fingerprint", kinds.fingerprint),
    "nvidia_driver_repo_keyring": Kind(
        "path", kinds.path("/etc/apt/keyrings/vllm-fleet-cuda.asc", under=APT_KEYRINGS)
    ),
    "nvidia_driver_distribution_url": APT_URL,
    "nvidia_driver_distribution_security_url": APT_URL,
    "nvidia_driver_distribution_suites": listed(Kind("apt-word", kinds.apt_word)),
    "nvidia_driver_distribution_components": listed(Kind("apt-word", kinds.apt_word)),
    "nvidia_driver_distribution_keyring": Kind(
        "path",
        kinds.path("/usr/share/keyrings/debian-archive-keyring.gpg", under=APT_KEYRINGS),
        optional=True,
    ),
    "nvidia_driver_repo_legacy_files": listed(
        Kind("path", kinds.path("/etc/apt/sources.list.d/cuda.list", under=("/etc/apt/sources.list.d",)))
    ),
    "nvidia_driver_manage_packages": ACCEPTED,
    "nvidia_driver_kernel_headers": ACCEPTED,
    "nvidia_driver_hold": ACCEPTED,
    "nvidia_driver_protect_existing": ACCEPTED,
    "nvidia_driver_blacklist_nouveau": ACCEPTED,
    "nvidia_driver_persistenced": ACCEPTED,
    "nvidia_driver_secure_boot_signed": ACCEPTED,
    "nvidia_driver_cuda_forward_compat": ACCEPTED,
    "nvidia_driver_vllm_lock_file": CONTROLLER,
    "nvidia_driver_recorded_smi": CONTROLLER,
    "nvidia_driver_record_dir": CONTROLLER,
    # vllm_install
    "vllm_install_allow_root_user": ACCEPTED,
    "vllm_install_allow_system_paths": ACCEPTED,
    "vllm_install_user": Kind("user", policy.not_root("vllm_install_allow_root_user")),
    "vllm_install_group": Kind("user", policy.not_root("vllm_install_allow_root_user")),
    "vllm_install_home": writable("vllm_install", "/var/lib/vllm-fleet"),
    "vllm_install_venv": writable("vllm_install", "/opt/vllm-fleet/venv"),
    "vllm_install_python": Kind("path", kinds.path("/usr/bin/python3")),
    "vllm_install_package": Kind("pip-package", kinds.pip_package),
    "vllm_install_version": PIP_VERSION,
    "vllm_install_index_url": Kind("url", kinds.url(("http", "https", "file")), optional=True),
    "vllm_install_extra_index_urls": listed(Kind("url", kinds.url(("http", "https", "file")))),
    "vllm_install_wheelhouse": Kind("path", kinds.path("/srv/wheelhouse"), optional=True),
    "vllm_install_dist_alias": Kind("dist-alias", kinds.dist_alias),
    "vllm_install_pip_timeout": SECONDS,
    "vllm_install_model_source": Kind("path", kinds.path("/srv/models/Qwen3-8B"), optional=True),
    "vllm_install_model_copy": ACCEPTED,
    "vllm_install_model_hub_repo": Kind("hf-repo", kinds.hf_repo, optional=True),
    "vllm_install_model_revision": Kind("revision", kinds.revision, optional=True),
    "vllm_install_model_hub_token": SECRET,
    "vllm_install_model_path": writable("vllm_install", "/var/lib/vllm-fleet/models/default"),
    # vllm_rollout
    "vllm_rollout_allow_system_paths": ACCEPTED,
    "vllm_rollout_connect_timeout": SHORT_SECONDS,
    "vllm_rollout_history_dir": writable("vllm_rollout", "/var/lib/vllm-fleet/history"),
    "vllm_rollout_history_keep": POSITIVE_COUNT,
    "vllm_rollout_pre_host_hooks": listed(CONTROLLER),
    "vllm_rollout_post_host_hooks": listed(CONTROLLER),
    "vllm_rollout_config_dir": writable("vllm_rollout", "/etc/vllm-fleet"),
    "vllm_rollout_unit_dir": writable("vllm_rollout", "/etc/systemd/system"),
    "vllm_rollout_unit_prefix": Kind("unit-prefix", kinds.unit_prefix),
    "vllm_rollout_state_dir": writable("vllm_rollout", "/var/lib/vllm-fleet/applied"),
    "vllm_rollout_deploy_roles": listed(Kind("role", kinds.role_name)),
    "vllm_rollout_verify_role": Kind("role", kinds.role_name),
    "vllm_rollout_max_fail_percentage": Kind("percent", kinds.number(0, 100, integer=True)),
    "vllm_rollout_hosts": LINE,
    "vllm_rollout_canary": ACCEPTED,  # inventory host names, matched against the inventory
    "vllm_rollout_serial": Kind("serial", kinds.delegated(rollout_serial)),
    "vllm_rollout_report_dir": CONTROLLER,
    "vllm_rollout_run_id": Kind("file-name", kinds.file_name, optional=True),
    # vllm_service
    "vllm_service_allow_root_user": ACCEPTED,
    "vllm_service_allow_system_paths": ACCEPTED,
    "vllm_service_host_plan": ACCEPTED,
    "vllm_service_model_config": ACCEPTED,  # a controller file or the mapping: plan.model_config reads it
    "vllm_service_capacity_check": ACCEPTED,
    "vllm_service_user": Kind("user", policy.not_root("vllm_service_allow_root_user")),
    "vllm_service_group": Kind("user", policy.not_root("vllm_service_allow_root_user")),
    "vllm_service_venv": HOST_PATH,
    "vllm_service_config_dir": writable("vllm_service", "/etc/vllm-fleet"),
    "vllm_service_unit_dir": writable("vllm_service", "/etc/systemd/system"),
    "vllm_service_unit_prefix": Kind("unit-prefix", kinds.unit_prefix),
    "vllm_service_cache_dir": writable("vllm_service", "/var/cache/vllm-fleet"),
    "vllm_service_read_write_paths": listed(writable("vllm_service", "/data/models")),
    "vllm_service_start_timeout": SECONDS,
    "vllm_service_restart_sec": SHORT_SECONDS,
    "vllm_service_start_limit_burst": POSITIVE_COUNT,
    "vllm_service_start_limit_interval": Kind("seconds", kinds.number(1, 604800, integer=True)),
    # the kernel's fs.nr_open ceiling
    "vllm_service_limit_nofile": Kind("count", kinds.number(1, 1073741816, integer=True)),
    "vllm_service_manage_state": ACCEPTED,
    "vllm_service_restart_wait": ACCEPTED,
    "vllm_service_extra_env": SERVE,
    "vllm_service_secret_env": SERVE,
    "vllm_service_remove_stale": ACCEPTED,
    "vllm_service_model": SERVE,
    "vllm_service_served_model_name": SERVE,
    "vllm_service_tensor_parallel_size": Kind("count", kinds.number(1, 1024, integer=True), optional=True),
    "vllm_service_nodes": listed(Kind("inventory-host", kinds.inventory_host)),
    "vllm_service_pipeline_parallel_size": Kind("count", kinds.number(1, 1024, integer=True), optional=True),
    "vllm_service_pp_layer_partition": listed(POSITIVE_COUNT),
    "vllm_service_master_port": PORT,
    "vllm_service_node_address": Kind("address", kinds.address, optional=True),
    "vllm_service_max_model_len": TOKENS,
    "vllm_service_dtype": SERVE,
    "vllm_service_kv_cache_dtype": SERVE,
    "vllm_service_kv_cache_memory_bytes": BYTES,
    "vllm_service_gpu_memory_utilization": Kind("fraction", kinds.number(0, 1, above=True), optional=True),
    "vllm_service_enable_prefix_caching": ACCEPTED,
    "vllm_service_enable_chunked_prefill": ACCEPTED,
    "vllm_service_max_num_batched_tokens": TOKENS,
    "vllm_service_max_num_seqs": Kind("count", kinds.number(1, 2**20, integer=True), optional=True),
    "vllm_service_scheduler_reserve_full_isl": ACCEPTED,
    "vllm_service_kv_offload_cpu_bytes": BYTES,
    "vllm_service_kv_offload_eviction_policy": SERVE,
    "vllm_service_kv_offload_prompt_only": ACCEPTED,
    "vllm_service_kv_offload_fs_tier": SERVE,
    "vllm_service_kv_offload_extra_config": SERVE,
    "vllm_service_speculative_config": SERVE,
    "vllm_service_rope_scaling": SERVE,
    "vllm_service_hf_overrides": SERVE,
    "vllm_service_limit_mm_per_prompt": SERVE,
    "vllm_service_mm_processor_kwargs": SERVE,
    "vllm_service_mm_ipc_gpu_memory_gb": Kind("gib", kinds.number(0, 4096), optional=True),
    "vllm_service_compilation_config": SERVE,
    "vllm_service_enforce_eager": ACCEPTED,
    "vllm_service_disable_custom_all_reduce": ACCEPTED,
    "vllm_service_reasoning_parser": SERVE,
    "vllm_service_tool_call_parser": SERVE,
    "vllm_service_enable_auto_tool_choice": ACCEPTED,
    "vllm_service_enable_prompt_tokens_details": ACCEPTED,
    "vllm_service_host": SERVE,
    "vllm_service_port": OPTIONAL_PORT,
    "vllm_service_api_key": SECRET,
    "vllm_service_allow_unauthenticated": ACCEPTED,
    "vllm_service_avg_input_len": TOKENS,
    "vllm_service_extra_args": SERVE,
    "vllm_service_numactl_path": Kind("path", kinds.path("/usr/bin/numactl")),
    # drained restarts behind the gateway (roles/vllm_service/tasks/restart_drained.yml)
    "vllm_service_gateway": Kind("inventory-host", kinds.inventory_host, optional=True),  # delegate_to
    "vllm_service_instance_set": Kind("instance-set", instance_set),
    "vllm_service_drain": ACCEPTED,
    "vllm_service_drain_timeout": SECONDS_OR_ZERO,  # 0: restart at once (the drain's verdict is timeout)
    # --shutdown-timeout and TimeoutStopSec (+60 s); 0 is vLLM's own abort
    "vllm_service_shutdown_timeout": SECONDS_OR_ZERO,
    # vllm_verify
    "vllm_verify_allow_remote_address": ACCEPTED,
    "vllm_verify_instances": ACCEPTED,  # the plan's instances (vllm_service sets them)
    "vllm_verify_config_dir": HOST_PATH,
    "vllm_verify_ready_timeout": SECONDS_OR_ZERO,
    "vllm_verify_ready_timeout_base": SECONDS_OR_ZERO,
    "vllm_verify_ready_timeout_per_gib": Kind("seconds", kinds.number(0, 3600, integer=True)),
    "vllm_verify_poll_interval": Kind("seconds", kinds.number(0, 600, above=True)),
    "vllm_verify_address": Kind(
        "own-address", policy.own_address("vllm_verify_allow_remote_address"), optional=True
    ),
    "vllm_verify_api_key": SECRET,
    "vllm_verify_prompt": ACCEPTED,  # sent as JSON by the request module, never written to a file
    "vllm_verify_max_tokens": Kind("tokens", kinds.number(1, 1048576, integer=True)),
    "vllm_verify_warmup_requests": COUNT,
    "vllm_verify_full": ACCEPTED,
    "vllm_verify_request_timeout": SHORT_SECONDS,
    "vllm_verify_spec_acceptance_min": FRACTION,
    "vllm_verify_ttft_p99_max": LATENCY,
    "vllm_verify_max_restarts": Kind("count", kinds.number(0, 1000, integer=True)),
    "vllm_verify_report_dir": CONTROLLER,
    "vllm_verify_fail_host": ACCEPTED,
}
