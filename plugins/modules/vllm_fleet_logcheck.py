# The code is the action plugin plugins/action/vllm_fleet_logcheck.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_logcheck
short_description: Check a vLLM instance's startup journal, API answers and /metrics against its plan
description:
  - Runs on the controller. Parses the journal of the instance's current start with
    C(vllm_fleet.verify.logcheck)
    (the same functions as C(vllm-fleet logcheck)) and checks it against the plan's C(expectations),
    KV-cache tokens within tolerance, maximum concurrency, kv-cache dtype in effect, attention backend,
    custom all-reduce state, NUMA binding lines, server ready; any fatal line fails the instance.
  - Checks the API answers gathered on the host (C(/health), C(/v1/models) with the served name and
    C(max_model_len), a completion and a chat completion returning tokens, C(/metrics)), and the figures of
    the verify window read from two C(/metrics) scrapes (prefix-cache hits on a repeated prompt,
    speculative-decoding acceptance, TTFT P50/P99 from the histogram buckets), and the unit's restart count.
  - Writes one JSON report per host and instance to I(report_dir) and fails the host on any failed check
    with what was expected, what was seen and where.
version_added: "0.1.0"
options:
  plan:
    description:
      - The instance plan (C(/etc/vllm-fleet/<instance>.json)) with C(instance), C(argv), C(port),
        C(expectations).
    type: dict
    required: true
  journal:
    description: The journal of the instance's current start (C(journalctl _SYSTEMD_INVOCATION_ID=...)).
    type: str
    required: true
  unit_show:
    description:
      - C(systemctl show -p ActiveState,SubState,Result,NRestarts,InvocationID,MainPID,ExecMainStatus)
        output.
    type: str
    required: true
  api:
    description:
      - Registered C(ansible.builtin.uri) results keyed C(health), C(models), C(completion), C(chat),
        C(metrics).
    type: dict
    default: {}
  metrics_before:
    description: C(/metrics) body scraped before the verify requests.
    type: str
    default: ""
  metrics_after:
    description: C(/metrics) body scraped after the verify requests and the warm-up load.
    type: str
    default: ""
  readiness:
    description: The result of M(vllm_fleet_wait), kept in the report.
    type: dict
    default: {}
  address:
    description:
      - The address the API was called on (default from the plan's C(--host), loopback for a
        wildcard).
    type: str
  host:
    description: Host name in the report (default C(inventory_hostname)).
    type: str
  report_dir:
    description: Controller folder for C(<host>--<instance>.json); no file is written when unset.
    type: path
  spec_acceptance_min:
    description:
      - Lowest acceptable speculative-decoding acceptance rate (0-1) when the plan enables it; unset,
        not judged.
    type: float
  ttft_p99_max_s:
    description: Highest acceptable TTFT P99 in seconds over the warm-up; unset, TTFT is reported, not judged.
    type: float
  max_restarts:
    description: Most automatic restarts (C(NRestarts)) a passing unit may have had.
    type: int
    default: 0
  fail_on_error:
    description: Fail the host when a check fails (false only records the report).
    type: bool
    default: true
  full:
    description:
      - Whether the test requests were sent (vllm_fleet_wait's O(full_checks)); false leaves their checks out.
    type: bool
    default: true
  verified_start:
    description: vllm_fleet_wait's O(verified_start), carried into the report when O(full=false).
    type: dict
    default: {}
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Check instance i0 against its plan
  vllm_fleet_logcheck:
    plan: "{{ plan }}"
    journal: "{{ journal.stdout }}"
    unit_show: "{{ show.stdout }}"
    api:
      health: "{{ health }}"
      models: "{{ models }}"
    metrics_before: "{{ before.content }}"
    metrics_after: "{{ after.content }}"
    report_dir: "{{ vllm_fleet_report_dir | default(none)
                    | vllm_fleet.serving.vllm_fleet_report_dir('verify') }}"
"""

RETURN = r"""
ok:
  description: Whether every check passed.
  type: bool
  returned: always
report:
  description:
    - The report (host, instance, unit, ok, checks with name/ok/expected/seen/line/detail, log, metrics,
      unit_state).
  type: dict
  returned: always
report_path:
  description: Where the report was written on the controller.
  type: str
  returned: when report_dir is set
verdict:
  description:
    - The instance's line in the vllm_verify role's C(vllm_verify_results) (C(instance), C(ok), C(msg),
      C(report_path)).
  type: dict
  returned: always
"""
