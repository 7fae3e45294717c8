# The code is the action plugin plugins/action/gpu_topology_facts.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: gpu_topology_facts
short_description: GPU, link, P2P and NUMA topology of a host, and the vLLM instance layout planned for it
description:
  - Runs, with the stock C(ansible.builtin.command) module, the read-only commands of
    C(vllm_fleet.probe.topology.RECORDED_COMMANDS) on the host (C(nvidia-smi topo -m), C(topo -p2p r),
    C(topo -p2p w), C(--query-gpu), C(numactl --hardware), C(lscpu), the PCI devices' sysfs C(numa_node)) and
    parses their output on the controller with C(vllm_fleet).
  - With O(recorded_dir), reads the same files from a folder on the controller instead, to plan for hardware
    that is not in hand.
  - A host without C(nvidia-smi) gets a CPU-only layout and report, not a failure. A host whose
    C(nvidia-smi) exists but fails is refused (its driver is broken; planning it as CPU-only would be wrong).
  - Changes nothing on the host.
version_added: "0.1.0"
options:
  recorded_dir:
    description: Controller folder of recorded outputs (file names of
      C(vllm_fleet.probe.topology.RECORDED_FILES)).
    type: path
  tensor_parallel_size:
    description: Tensor-parallel size per instance; omitted lets the planner pick.
    type: int
  model_config:
    description: The model's C(config.json) as a dict (attention and KV heads constrain the TP size).
    type: dict
    default: {}
  vllm_version:
    description: The vLLM release the layout is for (C(--numa-bind) needs 0.20 or later).
    type: str
  base_port:
    description: Port of the first instance.
    type: int
    default: 8000
  host_state_cmd:
    description: A read-only shell command printing hugepage and THP state (C(grep -H) format) for the report.
    type: str
  plan_layout:
    description:
      - Plan the instance layout for the probe's own report (C(playbooks/probe.yml)). False gives the facts
        only; preflight's plan (C(vllm_fleet_plan)) lays the instances out, once per run.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Probe this host
  gpu_topology_facts:
    tensor_parallel_size: 2
  check_mode: false

- name: Plan for a recorded 8 x RTX 4090 dual-socket server
  gpu_topology_facts:
    recorded_dir: "{{ playbook_dir }}/inventory/examples/8x4090-dual-socket/recorded"
"""

RETURN = r"""
gpu_topology:
  description: Also set as the fact C(gpu_topology).
  type: dict
  returned: always
  contains:
    topology:
      description: C(vllm_fleet.probe.topology.Topology.to_dict()) (GPUs, links, P2P, NUMA nodes, CPU).
      type: dict
    layout:
      description: C(vllm_fleet.plan.layout.Layout.to_dict()), the instances with GPUs, port, NUMA binding,
        env.
      type: dict
    cpu_only:
      description: True when the host has no NVIDIA driver (no C(nvidia-smi)).
      type: bool
    report:
      description: The readable report.
      type: str
    source:
      description: "C(probed live) or C(recorded: <folder>)."
      type: str
    notes:
      description: Commands that were missing or failed, and were left out.
      type: list
    hugepages:
      description: Hugepages per NUMA node and size, as read on the host.
      type: list
"""
