# The code is the action plugin plugins/action/vllm_fleet_gateway_server.py; this file carries its
# documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_gateway_server
short_description: Drain one vLLM instance at the HAProxy gateway before it restarts, or put it back
description:
  - Runs on the gateway host (C(delegate_to)). With O(state=drain) it sends HAProxy's runtime API
    C(set server set_<set>/<host>-<instance> state drain) (no new requests; those in flight go on), then
    polls C(show stat) and the instance's C(/metrics) until the gateway shows no session to it (C(scur) 0)
    and vLLM's C(num_requests_running) and C(num_requests_waiting) are 0, at most O(timeout) seconds. A
    drain that times out is a warning, not a failure, and the restart goes on, since vLLM's
    C(--shutdown-timeout) finishes what is left.
  - With O(state=ready) it sends C(state ready). A server the gateway does not have (a config generated
    without it) changes nothing and returns RV(behind_gateway) false.
  - Which server, what to wait for and the verdict come from C(vllm_fleet.gateway.drain); each poll is one
    command on the gateway host running that module's read script with the host's own python3.
version_added: "0.1.0"
options:
  plan:
    description: The instance plan (C(/etc/vllm-fleet/<instance>.json), or its entry in the host's plan).
    type: dict
    required: true
  instance_set:
    description: The instance's set (C(vllm_service_instance_set)); the backend is C(set_<set>).
    type: str
    default: long
  host_address:
    description: The address the gateway dials the instance's host at (its C(ansible_host)).
    type: str
    required: true
  gateway_host:
    description: The gateway's inventory host (an instance on loopback is reachable from its own host only).
    type: str
  state:
    description: C(drain) to take the server out and wait, C(ready) to put it back.
    type: str
    choices: [drain, ready]
    required: true
  socket:
    description: HAProxy's runtime API socket on the gateway host (C(fleet_gateway_runtime_socket)).
    type: path
    default: /run/haproxy/admin.sock
  timeout:
    description: Seconds to wait for the drain.
    type: int
    default: 300
  interval:
    description: Seconds between polls.
    type: float
    default: 1.0
  python:
    description: The gateway host's python3.
    type: path
    default: /usr/bin/python3
author:
  - vllm-fleet contributors
"""

EXAMPLES = r"""
- name: Take the instance out of the gateway and wait for its requests to finish
  vllm_fleet.serving.vllm_fleet_gateway_server:
    plan: "{{ plan }}"
    instance_set: short
    host_address: 10.0.0.12
    state: drain
    timeout: 300
  delegate_to: gateway-1
"""

RETURN = r"""
backend:
  description: The gateway's backend of the instance.
  type: str
  returned: always
server:
  description: The gateway's server name of the instance (C(<host>-<instance>)).
  type: str
  returned: always
behind_gateway:
  description: Whether the gateway has that server.
  type: bool
  returned: always
verdict:
  description: C(drained) or C(timeout) after a drain; C(not behind the gateway) when it has no such server.
  type: str
  returned: when state is drain
reason:
  description: Why the drain ended.
  type: str
  returned: when a drain was waited on
waited_s:
  description: Seconds waited.
  type: float
  returned: when a drain was waited on
scur:
  description: Sessions at the gateway at the end of the wait.
  type: int
  returned: when a drain was waited on
running:
  description: vLLM's num_requests_running at the end of the wait.
  type: float
  returned: when a drain was waited on
waiting:
  description: vLLM's num_requests_waiting at the end of the wait.
  type: float
  returned: when a drain was waited on
"""
