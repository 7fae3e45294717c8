# The code is the action plugin plugins/action/vllm_fleet_lab_up.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_lab_up
short_description: Bring a lab up on the controller, showing its progress in the play as it happens
description:
  - Runs C(vllm-fleet lab up --name NAME --host H ... --json) on the controller and relays every line it
    prints on stderr to the play's output while it runs (its stages, and the lab caches' build progress, that
    is what is fetched, packages or bytes done, the cache folder it fills).
  - A lab that is already up is reused and reported unchanged.
version_added: "0.1.0"
options:
  cli:
    description: The vllm-fleet command (the one beside the Python that runs the play).
    type: str
    required: true
  name:
    description: The lab's name.
    type: str
    required: true
  hosts:
    description: The lab's host names, in order.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds after which C(lab up) is stopped (it tears down what it created).
    type: int
    default: 3600
  preinstalled_vllm:
    description:
      - Start the hosts with the vLLM venv that C(vllm-fleet lab save-vllm) saved for the lab's wheelhouse,
        when there is one (C(lab up --preinstalled-vllm)), so that the vllm_install role finds vLLM installed
        and pip does not run. For tests of what comes after the install; without a saved venv the hosts start
        without one.
    type: bool
    default: false
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Bring the lab up
  vllm_fleet_lab_up:
    cli: "{{ ansible_playbook_python | dirname }}/vllm-fleet"
    name: default
    hosts: [default-1]
"""

RETURN = r"""
stdout:
  description: The JSON object C(lab up --json) printed (name, changed, hosts with addresses, timings_s).
  type: str
  returned: always
stderr:
  description: The progress lines, as relayed.
  type: str
  returned: always
rc:
  description: The exit status of C(lab up).
  type: int
  returned: always
"""
