# The code is the action plugin plugins/action/vllm_fleet_wait.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_wait
short_description: Wait for a vLLM instance to become ready; fail fast with the fatal log line when it crashes
description:
  - Polls, in a bounded loop, both the unit's state (C(systemctl show)) and the API's C(/health)
    (connection refused while the model loads, 200 when ready, 503 once the engine died).
  - A crash while loading (C(NRestarts) rising, a new C(InvocationID), C(ActiveState=failed),
    C(SubState=auto-restart)) ends the wait at once; the journal of the start that was waited on is parsed
    with C(vllm_fleet.logcheck) and the task fails with the fatal line (max_model_len larger than the KV
    cache, out of memory, unrecognized arguments, engine init failure) and a fix.
version_added: "0.1.0"
options:
  unit:
    description: The systemd unit, e.g. C(vllm-fleet-i0.service).
    type: str
    required: true
  url:
    description: The instance's C(/health) URL, called from the host itself.
    type: str
    required: true
  timeout:
    description: Seconds to wait before giving up (the role derives it from the model's size).
    type: int
    required: true
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
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Wait for vllm-fleet-i0 to answer
  vllm_fleet_wait:
    unit: vllm-fleet-i0.service
    url: http://127.0.0.1:8000/health
    timeout: 600
"""

RETURN = r"""
state:
  description: ready, crashed, engine_dead, stopped or timeout.
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
invocation_id:
  description: The InvocationID of the start that was waited on (its journal is the one to check).
  type: str
  returned: always
unit_state:
  description: The unit's last C(systemctl show) properties.
  type: dict
  returned: always
errors:
  description: Fatal log lines (kind, line) of the failed start.
  type: list
  returned: on failure
"""
