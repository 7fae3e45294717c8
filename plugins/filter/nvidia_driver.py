"""Filters for the nvidia_driver and cuda_toolkit roles: thin adapters over `vllm_fleet.deploy.driver`.

The roles gather raw text on the host (the probe script, dpkg-query, the repository key); these filters run
on the controller and return plain dicts/lists. A `FleetInputError` becomes an `AnsibleFilterError` carrying
the message (which names the variable, the value and the fix).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy import driver
from vllm_fleet.errors import FleetInputError


def _pin(branch: Any, version: Any, open_kernel_modules: Any) -> driver.DriverPin:
    return driver.DriverPin.from_vars(branch, version, open_kernel_modules)


def nvidia_driver_assess(
    probe: str,
    branch: Any,
    version: Any = "",
    open_kernel_modules: Any = True,
    expected_gpu_count: Any = None,
    force: bool = False,
    signed_modules: bool = False,
) -> dict[str, Any]:
    """The probe script's stdout → the assessment dict (status, reboot_required, reasons, refusal, ...)."""
    try:
        count = None if expected_gpu_count in (None, "", 0) else int(expected_gpu_count)
        pin = _pin(branch, version, open_kernel_modules)
        return driver.assess_driver(
            probe, pin, expected_gpu_count=count, force=bool(force), signed_modules=bool(signed_modules)
        ).to_dict()
    except (FleetInputError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_driver_verify(
    assessment: dict[str, Any], branch: Any, version: Any = "", expected: Any = None
) -> list:
    """Problems left after an install: [] when nvidia-smi answers, matches the pin and sees every GPU."""
    try:
        pin = _pin(branch, version, assessment["pin"]["open_kernel_modules"])
        result = driver.DriverAssessment(**assessment)
        count = None if expected in (None, "", 0) else int(expected)
        return driver.verify_driver(result, pin, count)
    except (FleetInputError, ValueError, KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"nvidia_driver_verify: {exc}") from exc


def nvidia_driver_reboot(
    policy: str,
    reboot_required: bool,
    changed: bool,
    connection: str | None,
    inventory_hostname: str,
    container: str | None = None,
) -> dict[str, Any]:
    try:
        return driver.decide_reboot(
            policy,
            reboot_required=bool(reboot_required),
            changed=bool(changed),
            connection=connection,
            inventory_hostname=inventory_hostname,
            container=container or None,
        ).to_dict()
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_driver_is_local(connection: str | None, inventory_hostname: str) -> bool:
    return driver.is_local_connection(connection, inventory_hostname)


def nvidia_driver_pin(branch: Any, version: Any = "", open_kernel_modules: Any = True) -> dict[str, Any]:
    """Validated pin: {branch, version, open_kernel_modules, apt_version, describe}."""
    try:
        pin = _pin(branch, version, open_kernel_modules)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {
        "branch": pin.branch,
        "version": pin.version,
        "open_kernel_modules": pin.open_kernel_modules,
        "apt_version": pin.apt_version,
        "describe": pin.describe(),
    }


def nvidia_driver_apt_sources(role_vars: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """{source, file, stale_files, stanzas, key_needed, packages} for the role's variables and the host."""
    try:
        return driver.apt_sources(role_vars, facts)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_driver_cuda_gate(
    vllm_version: str,
    driver_version: str | None,
    gpu_names: list[str],
    lock_text: str = "",
    forward_compat: bool = False,
    driver_source: str = "detected",
) -> dict[str, Any]:
    """The CUDA build of the vLLM to install against the host's driver: {ok, message, ...}."""
    try:
        return driver.cuda_gate(
            str(vllm_version),
            driver_version or None,
            list(gpu_names or []),
            lock_text=lock_text or "",
            forward_compat=bool(forward_compat),
            driver_source=driver_source,
        ).to_dict()
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_driver_smi_table(text: str) -> dict[str, Any]:
    """Plain `nvidia-smi` output → {driver_version, cuda_version, gpus: [names]}."""
    return driver.parse_smi_table(text)


def nvidia_driver_repo_url(base: str, os_id: str, os_version: str, arch: str) -> str:
    try:
        return driver.cuda_repo_url(base, os_id, os_version, arch)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_driver_key_check(key: str, fingerprint: str, source: str) -> str:
    try:
        return driver.check_key_fingerprint(key, fingerprint, source)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_driver_dpkg(text: str) -> dict[str, dict[str, Any]]:
    """dpkg-query lines → {name: {name, version, installed, held}}."""
    return {name: vars(p) for name, p in driver.parse_dpkg_query(text).items()}


def nvidia_driver_hold_list(text: str, extra: list[str] | None = None) -> list[str]:
    """dpkg-query lines → the installed driver-stack packages (plus `extra`) to hold."""
    return driver.packages_to_hold(driver.parse_dpkg_query(text), list(extra or []))


def nvidia_cuda_toolkit_package(version: Any) -> str:
    try:
        return driver.cuda_toolkit_package(version)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def nvidia_cuda_toolkit_installed(dpkg_text: str, version: Any) -> bool:
    return driver.cuda_toolkit_installed(driver.parse_dpkg_query(dpkg_text), str(version))


def nvidia_cuda_driver_compatible(cuda_version: Any, driver_version: str | None) -> dict[str, Any]:
    ok, detail = driver.cuda_driver_compatible(str(cuda_version), driver_version or None)
    return {"ok": ok, "detail": detail}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_driver_assess": nvidia_driver_assess,
            "nvidia_driver_verify": nvidia_driver_verify,
            "nvidia_driver_reboot": nvidia_driver_reboot,
            "nvidia_driver_is_local": nvidia_driver_is_local,
            "nvidia_driver_pin": nvidia_driver_pin,
            "nvidia_driver_apt_sources": nvidia_driver_apt_sources,
            "nvidia_driver_cuda_gate": nvidia_driver_cuda_gate,
            "nvidia_driver_smi_table": nvidia_driver_smi_table,
            "nvidia_driver_repo_url": nvidia_driver_repo_url,
            "nvidia_driver_key_check": nvidia_driver_key_check,
            "nvidia_driver_dpkg": nvidia_driver_dpkg,
            "nvidia_driver_hold_list": nvidia_driver_hold_list,
            "nvidia_cuda_toolkit_package": nvidia_cuda_toolkit_package,
            "nvidia_cuda_toolkit_installed": nvidia_cuda_toolkit_installed,
            "nvidia_cuda_driver_compatible": nvidia_cuda_driver_compatible,
        }
