# The code is the action plugin plugins/action/vllm_fleet_wait.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_wait
short_description: Wait for a vLLM instance to become ready; fail fast with the fatal log line when it crashes
description:
  - Polls, in a bounded loop, both the unit's state (C(systemctl show)) and the API's C(/health)
    (connection refused while the model loads, 200 when ready, 503 once the engine died), each poll one call
    of P(vllm_fleet.serving.vllm_fleet_instance_read#module) on the host.
  - The poll that finds the instance ready also reads, when O(checks) is true, the journal of the current
    start, C(/v1/models) and C(/metrics) (RV(reads)), so an instance that is up costs one round trip.
    The model's size on disk (for a derived O(timeout)) is read only when the first poll finds it loading.
  - A crash while loading (C(NRestarts) rising, a new C(InvocationID), C(ActiveState=failed),
    C(SubState=auto-restart)) ends the wait at once; the journal of the start that was waited on is parsed
    with C(vllm_fleet.verify.logcheck) and the task fails with the fatal line (max_model_len larger than the
    KV
    cache, out of memory, unrecognized arguments, engine init failure) and a fix.
version_added: "0.1.0"
options:
  plan:
    description:
      - The instance plan (C(/etc/vllm-fleet/<instance>.json)); the unit, the C(/health) URL (the instance's
        own C(--host), loopback for a wildcard) and the model path come from it.
    type: dict
    required: true
  address:
    description: Call C(/health) on this address instead of the plan's C(--host).
    type: str
  timeout:
    description:
      - Seconds to wait before giving up; 0 derives it from the model's size on disk
        (I(timeout_base) + I(timeout_per_gib) per GiB, at most 3600).
    type: int
    default: 0
  timeout_base:
    description: Seconds of the derived deadline for engine start without the weights.
    type: int
    default: 600
  timeout_per_gib:
    description: Seconds of the derived deadline per GiB of weights.
    type: int
    default: 20
  interval:
    description: Seconds between polls.
    type: float
    default: 2.0
  request_timeout:
    description: Seconds one C(/health) request may take.
    type: int
    default: 5
  journal_lines:
    description: Lines of the unit's journal to read when the failed start logged under no invocation id.
    type: int
    default: 2000
  progress_interval:
    description:
      - Seconds between the progress lines printed while waiting (seconds waited of the timeout, unit state,
        /health, the last line vLLM logged); 0 prints none.
    type: int
    default: 10
  report_dir:
    description:
      - Where vllm_fleet_logcheck keeps the instance's last report; read to decide O(full_checks).
    type: path
  full:
    description: Report O(full_checks=true) whatever the last report says (vllm_verify_full).
    type: bool
    default: false
  checks:
    description: Read what verify checks (RV(reads)) in the poll that finds the instance ready.
    type: bool
    default: true
  api_key:
    description: The Bearer token C(/v1/models) needs when the instance runs with one; never returned.
    type: str
    default: ""
  checks_timeout:
    description: Seconds the C(/v1/models) and C(/metrics) requests of RV(reads) may take.
    type: int
    default: 120
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Wait for instance i0 to answer (deadline from the model's size)
  vllm_fleet_wait:
    plan: "{{ lookup('ansible.builtin.file', 'i0.json') | from_json }}"
"""

RETURN = r"""
state:
  description: ready, crashed, engine_dead, stopped or timeout.
  type: str
  returned: always
target:
  description: Where the API answers (unit, base_url, served_model_name, max_model_len, ...).
  type: dict
  returned: always
unit_show:
  description: The last C(systemctl show) text (the state the verdict was taken on).
  type: str
  returned: always
last_health:
  description: The last C(/health) answer (status, msg).
  type: dict
  returned: always
timeout:
  description: The deadline used, in seconds (O(timeout) itself, 0 by default, when the first poll decided).
  type: str
  returned: always
reason:
  description: Why, in words.
  type: str
  returned: always
waited_s:
  description: Seconds waited.
  type: float
  returned: always
progress_lines:
  description: How many progress lines the wait printed (one per O(progress_interval) while not ready).
  type: int
  returned: always
invocation_id:
  description: The InvocationID of the start that was waited on (its journal is the one to check).
  type: str
  returned: always
unit_state:
  description: The unit's last C(systemctl show) properties.
  type: dict
  returned: always
full_checks:
  description:
    - False when the last report passed and its full checks vouch for this start (InvocationID) of this plan
      (then the test requests need not be sent again); true otherwise.
  type: bool
  returned: when ready
verified_start:
  description: What the last full check vouched for (invocation_id, plan_sha256), when full_checks is false.
  type: dict
  returned: when ready
reads:
  description:
    - C(journal) (the text of the current start's journal), C(health), C(models) and C(metrics) (the answers,
      as ansible.builtin.uri gives them), read in the poll that found the instance ready.
  type: dict
  returned: when ready and O(checks)
errors:
  description: Fatal log lines (kind, line) of the failed start.
  type: list
  returned: on failure
"""
