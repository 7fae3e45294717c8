# The code is the action plugin plugins/action/vllm_fleet_validate.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_validate
short_description: Check every role's variables on the controller; touches no host
description:
  - Reads the variables every role of the collection will use (their defaults under the inventory's values)
    and checks them as preflight's C(vllm_fleet_plan) does, without building a plan, for playbooks that do
    not import preflight (C(playbooks/monitoring.yml)).
  - The argument specs' types (ansible-core's ArgumentSpecValidator), then each variable's kind from
    C(vllm_fleet.validate) (paths inside their folder, package names, URLs, users, ports unique on the host,
    finite numbers in range, the policies and their opt-ins), then the inventory host name as a report name.
  - Fails with every message at once, each naming the variable, the value (masked for a secret) and the fix.
version_added: "0.1.0"
author:
  - vllm-fleet contributors
options:
  roles_dir:
    description: The folder holding the roles whose variables are checked.
    type: path
    required: true
notes:
  - Runs on the controller only; it needs the vllm_fleet Python library there.
"""

EXAMPLES = r"""
- name: Check every role's variables before any host changes
  vllm_fleet.serving.vllm_fleet_validate:
    roles_dir: "{{ playbook_dir | regex_replace('/playbooks/?$', '') }}/roles"
"""

RETURN = r"""
msg:
  description: Every refusal, one per line, when the variables are refused.
  type: str
  returned: failure
"""
