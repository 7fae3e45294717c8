# The code is the action plugin plugins/action/vllm_fleet_requests.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_requests
short_description: Send a vLLM instance's test requests from its host (completion, chat, warm-up, /metrics)
description:
  - Sends, in this order, a completion and a chat completion of O(prompt), then O(warmup_requests)
    completions of a prompt repeated to span more than one KV block (sized from the first answer's token
    count and the block size in O(metrics_before); prefix-cache hits and TTFT are read over them), then
    scrapes C(/metrics). The requests are those of C(vllm-fleet verify) (C(vllm_fleet.verify.live)).
  - Each request is one call of M(ansible.builtin.uri) on the host, so an instance that listens on loopback is
    reached where it runs. An HTTP error status is an answer, not a failure; the verdict is
    M(vllm_fleet.serving.vllm_fleet_logcheck)'s.
  - The vllm_verify role sends them after an instance's (re)start, a plan change or a failed check (the
    RV(vllm_fleet.serving.vllm_fleet_wait#module:full_checks) of its wait), looped over the host's instances.
version_added: "0.1.0"
options:
  plan:
    description:
      - The instance plan (C(/etc/vllm-fleet/<instance>.json)); the URL and the served model name come from
        it, as for M(vllm_fleet.serving.vllm_fleet_wait).
    type: dict
    required: true
  address:
    description: Call the API on this address instead of the plan's C(--host).
    type: str
  metrics_before:
    description: The C(/metrics) body read before the requests (the KV block size for the warm-up prompt).
    type: str
    default: ""
  prompt:
    description: The prompt of the completion and chat requests, repeated for the warm-up.
    type: str
    required: true
  max_tokens:
    description: Tokens each request asks for.
    type: int
    default: 8
  warmup_requests:
    description: Completions of the repeated prompt after the first two requests.
    type: int
    default: 8
  timeout:
    description: Seconds each request may take.
    type: int
    default: 120
  api_key:
    description: vLLM's C(--api-key), sent as a bearer token; never returned or logged.
    type: str
    default: ""
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Send the test requests of each instance that was (re)started
  vllm_fleet.serving.vllm_fleet_requests:
    plan: "{{ item.__vllm_verify_plan }}"
    metrics_before: "{{ item.reads.metrics.content | default('') }}"
    prompt: "Say hello."
  loop: "{{ waits.results }}"
  when: item.full_checks | default(true)
  register: requests
"""

RETURN = r"""
api:
  description:
    - The answers as M(ansible.builtin.uri) registers them (C(status), C(content), C(json)), keyed
      C(completion), C(chat), C(metrics) (the scrape after the warm-up).
  type: dict
  returned: always
metrics_before:
  description: O(metrics_before), passed through.
  type: str
  returned: always
metrics_after:
  description: The C(/metrics) body after the warm-up.
  type: str
  returned: always
warmup:
  description: The HTTP status of each warm-up request (-1 for no answer).
  type: list
  elements: int
  returned: always
probe_prompt:
  description: The repeated prompt the warm-up sent.
  type: str
  returned: always
"""
