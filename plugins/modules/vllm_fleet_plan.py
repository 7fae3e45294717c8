# The code is the action plugin plugins/action/vllm_fleet_plan.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_plan
short_description: Build the host's plan on the controller and check every role's variables; touches no host
description:
  - Reads the variables every role of the collection will use and checks them against the roles' argument
    specs (ansible-core's own Templar and ArgumentSpecValidator, as C(vllm-fleet plan --inventory) does),
    then each by its kind (C(vllm_fleet.validate)), the ports of the host's listeners and the inventory host
    name; refused variables fail the host before any plan is built or any report written.
  - Builds the host's plan with C(vllm_fleet.plan.build.build_host_plan) (instance layout, serve commands,
    capacity, fleet checks) from the probed topology and the model's config.json.
  - Fails with every error of the host at once; nothing is changed on any host. Returns the plan as the fact
    C(vllm_fleet_plan) and writes it (and the probe's facts) on the controller.
version_added: "0.1.0"
author:
  - vllm-fleet contributors
options:
  topology:
    description: The probed topology (C(gpu_topology.topology), from the gpu_topology role).
    type: dict
    required: true
  source:
    description: Where the topology came from, for the report (probed live, or the recording's name).
    type: str
    default: probed live
  vllm_version:
    description: The vLLM version the plan is made for (its flags are checked against that version).
    type: str
    required: true
  model_config:
    description: The model's config.json given by the inventory (C(vllm_service_model_config)); a dict or a
      path relative to the inventory.
    type: raw
  model_config_read:
    description: The config.json read on the host (C(path) and base64 C(content)); used when I(model_config)
      is not given.
    type: dict
    default: {}
  roles_dir:
    description: The folder holding the roles whose argument specs are checked.
    type: path
    required: true
  probe:
    description: The probe's facts, written to I(probe_dir) for C(vllm-fleet plan --inventory).
    type: dict
  probe_dir:
    description: Controller folder for the probe's facts (C(<host>.json)).
    type: path
  plan_dir:
    description: Controller folder for the plan (C(<host>.json)), written only when it has no error.
    type: path
notes:
  - Runs on the controller only; it needs the vllm_fleet Python library there.
"""

EXAMPLES = r"""
- name: Build this host's plan and check every role's variables
  vllm_fleet.serving.vllm_fleet_plan:
    topology: "{{ gpu_topology.topology }}"
    source: "{{ gpu_topology.source }}"
    vllm_version: "{{ vllm_install_version }}"
    roles_dir: "{{ playbook_dir }}/../roles"
    plan_dir: "{{ vllm_fleet_report_dir | default(none) | vllm_fleet.serving.vllm_fleet_report_dir('plan') }}"
"""

RETURN = r"""
plan:
  description: The host's plan (C(HostPlan.to_dict())), also set as the fact C(vllm_fleet_plan).
  type: dict
  returned: always
plan_path:
  description: Where the plan was written on the controller.
  type: str
  returned: when plan_dir is set and the plan has no error
"""
