"""Thin filters over vllm_fleet.rollout.decisions for the rollout playbook; every rule lives in that
module."""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.errors import FleetInputError
from vllm_fleet.rollout import decisions as rollout


def _plain(value: Any) -> Any:
    """Ansible hands filters lazy template containers; the pure code wants plain JSON data."""
    return json.loads(json.dumps(value))


def _call(func: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return func(*_plain(list(args)), **_plain(kwargs))
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_rollout_serial(value: Any) -> list[Any]:
    return _call(rollout.parse_serial, value)


def vllm_rollout_split_canary(hosts: list[str], canary: list[str]) -> dict[str, list[str]]:
    chosen, rest = _call(rollout.split_canary, hosts, canary)
    return {"canary": chosen, "rest": rest}


def vllm_rollout_group_errors(
    split: dict[str, list[str]], hostvars: Any, serial: list[Any], targets: list[str]
) -> list[str]:
    """Why the canary and `serial`'s batches would split a multi-host instance ([] when none is split); the
    plans are the targets' vllm_fleet_plan (preflight's), read from `hostvars` one host at a time."""
    plans = {h: hostvars[h].get("vllm_fleet_plan") or {} for h in targets if h in hostvars}
    batches = [split["canary"], *_call(rollout.plan_batches, split["rest"], serial)]
    return _call(rollout.group_batch_errors, batches, _call(rollout.instance_groups, plans), targets)


def vllm_rollout_failed_peers(host: str, hostvars: Any, batch: list[str]) -> list[str]:
    """The hosts of `host`'s multi-host instance in `batch` (`ansible_play_batch`) whose turn failed: each
    one's vllm_fleet_plan (preflight's) and __vllm_rollout_failure, read from `hostvars`."""
    hosts = [h for h in batch if h in hostvars]
    plans = {h: hostvars[h].get("vllm_fleet_plan") or {} for h in hosts}
    failures = {h: hostvars[h].get("__vllm_rollout_failure") for h in hosts}
    return _call(rollout.failed_peers, host, _call(rollout.instance_groups, plans), failures, hosts)


def vllm_rollout_fingerprint(find_results: list[dict[str, Any]]) -> str | None:
    """Fingerprint of the files `ansible.builtin.find` (get_checksum) listed, by base name."""
    checksums = {str(f["path"]).rsplit("/", 1)[-1]: str(f.get("checksum", "")) for f in find_results}
    return _call(rollout.config_fingerprint, checksums)


def vllm_rollout_prune(find_results: list[dict[str, Any]], keep: Any, protect: list[str]) -> list[str]:
    return _call(rollout.history_to_prune, find_results, keep, protect)


def vllm_rollout_instances(file_names: list[str], prefix: str = "vllm-fleet-") -> list[str]:
    return _call(rollout.instance_names, file_names, prefix)


def vllm_rollout_restore_order(plans: list[Any], instances: list[str]) -> dict[str, list[str]]:
    return _call(rollout.restore_order, plans, instances)


def vllm_rollout_record(facts: dict[str, Any]) -> dict[str, Any]:
    return _call(rollout.host_result, **facts)


def vllm_rollout_verdict(statuses: dict[str, str], max_fail: Any, canary: bool = False) -> dict[str, Any]:
    return _call(rollout.batch_verdict, statuses, max_fail, canary=canary)


def vllm_rollout_batches(hosts: list[str], serial: Any) -> list[list[str]]:
    return _call(rollout.plan_batches, hosts, serial)


def vllm_rollout_batch_verdict(
    records: list[dict[str, Any]], batch: list[str], max_fail: Any, canary: bool = False
) -> dict[str, Any]:
    return _call(rollout.batch_verdict_from_records, records, batch, max_fail, canary=canary)


def vllm_rollout_table(summary: dict[str, Any]) -> str:
    return _call(rollout.format_summary, summary)


def vllm_rollout_summary(records: list[dict[str, Any]], targets: list[str], **kwargs: Any) -> dict[str, Any]:
    return _call(rollout.summarize, targets, records, **kwargs)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_rollout_serial": vllm_rollout_serial,
            "vllm_rollout_split_canary": vllm_rollout_split_canary,
            "vllm_rollout_group_errors": vllm_rollout_group_errors,
            "vllm_rollout_failed_peers": vllm_rollout_failed_peers,
            "vllm_rollout_fingerprint": vllm_rollout_fingerprint,
            "vllm_rollout_prune": vllm_rollout_prune,
            "vllm_rollout_instances": vllm_rollout_instances,
            "vllm_rollout_restore_order": vllm_rollout_restore_order,
            "vllm_rollout_record": vllm_rollout_record,
            "vllm_rollout_verdict": vllm_rollout_verdict,
            "vllm_rollout_summary": vllm_rollout_summary,
            "vllm_rollout_batches": vllm_rollout_batches,
            "vllm_rollout_batch_verdict": vllm_rollout_batch_verdict,
            "vllm_rollout_table": vllm_rollout_table,
        }
