# The code is the action plugin plugins/action/vllm_fleet_rollout_record.py; this file documents it.

DOCUMENTATION = r"""
---
module: vllm_fleet_rollout_record
short_description: Write a host's rollout record and the fleet summary on the controller
description:
  - Runs on the controller. Writes O(record) as C(hosts/<inventory_hostname>.json) in O(run_dir), then the
    fleet summary of every record there as C(summary.json) (C(vllm_fleet.rollout.records.record_turn)), each
    indented JSON, mode 0644, replaced whole.
  - Used by the P(vllm_fleet.serving.vllm_rollout#role) role at the start and the end of each host's turn,
    with C(throttle) 1 (the hosts of a batch rewrite the same summary). Reports about the run, not a change
    to a managed host.
version_added: "0.1.0"
options:
  record:
    description: The host's record (C(vllm_fleet.rollout.decisions.host_result)).
    type: dict
    required: true
  run_dir:
    description: The rollout's run folder on the controller.
    type: path
    required: true
  targets:
    description: The rollout's target hosts, in order.
    type: list
    elements: str
    required: true
  started_at:
    description: When the rollout started (seconds since the epoch).
    type: float
attributes:
  check_mode:
    support: full
    details: Writes its reports in check mode too, as the role's other reports.
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Write this host's record and the fleet summary on the controller
  vllm_fleet.serving.vllm_fleet_rollout_record:
    record: "{{ __vllm_rollout_record }}"
    run_dir: "{{ __vllm_rollout_run_dir }}"
    targets: "{{ hostvars['localhost'].__vllm_rollout_targets }}"
    started_at: "{{ hostvars['localhost'].__vllm_rollout_started_at }}"
  throttle: 1
"""

RETURN = r"""
result:
  description: The summary's result so far (C(in_progress), C(ok), C(failed)...).
  type: str
  returned: always
"""
