# The code is the action plugin plugins/action/vllm_fleet_render.py; this file carries its documentation.

DOCUMENTATION = r"""
---
module: vllm_fleet_render
short_description: Render and validate the vllm serve command of every instance of a host
description:
  - Runs on the controller; touches no host. Reads the C(vllm_service_*) variables into
    C(vllm_fleet.render.schema.ServeSpec), renders one C(vllm serve) argv per instance of the layout for the
    target
    vLLM release with C(vllm_fleet.render.serve) (the same functions as C(vllm-fleet render)), and validates
    it with
    C(vllm_fleet.render.validate) against the flag catalog of that release, the model's config.json, the
    KV-cache
    plan and the host's topology.
  - Fails the task with every error at once (a flag or a choice the release does not have, YaRN reach below
    max_model_len, a request that fits neither GPU nor CPU KV, TP not dividing the heads, auto tool choice
    without a parser, custom all-reduce without P2P, a CPU tier larger than its NUMA node's memory). Shows
    warnings (max_num_seqs unreachable, gpu_memory_utilization ignored, batched tokens below
    seqs x (speculative tokens + 1)...).
version_added: "0.1.0"
options:
  vars:
    description:
      - The C(vllm_service_*) variables as a dict. Default, every C(vllm_service_*) variable of the host.
    type: dict
  layout:
    description: The layout, C(gpu_topology.layout) (or the whole C(gpu_topology) fact, or an instance list).
    type: raw
    required: true
  vllm_version:
    description: The vLLM release the command is for (C(vllm_install_installed_version)).
    type: str
    required: true
  model_config:
    description: The model's config.json (C(vllm_install_model_config)); empty skips the capacity rules.
    type: dict
    default: {}
  topology:
    description: The topology JSON (C(gpu_topology.topology)) for the P2P and NUMA-memory rules.
    type: dict
    default: {}
  fail_on_error:
    description: Fail the task when a rule finds an error (false returns them only).
    type: bool
    default: true
notes:
  - The API key (C(vllm_service_api_key)) never appears in the result; C(secret_env_names) lists the
    variables the role must write to the 0600 EnvironmentFile.
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Render the serve command of every instance
  vllm_fleet_render:
    layout: "{{ gpu_topology.layout }}"
    vllm_version: "{{ vllm_install_installed_version }}"
    model_config: "{{ vllm_install_model_config | default({}) }}"
    topology: "{{ gpu_topology.topology }}"
  register: __vllm_service_rendered
"""

RETURN = r"""
instances:
  description: One entry per layout instance.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Instance name (i0, i1...)., type: str}
    argv: {description: The full argv, numactl wrapper included., type: list}
    exec_start: {description: The argv quoted for a systemd ExecStart= line (% and $ escaped)., type: str}
    shell: {description: The argv quoted for a POSIX shell., type: str}
    env: {description: Environment of the instance (CUDA/NCCL variables)., type: dict}
    secret_env_names: {description: Secrets to write to the EnvironmentFile (VLLM_API_KEY)., type: list}
    port: {description: API port., type: int}
    expectations: {description: What verify checks in the startup log (kv_cache_tokens...)., type: dict}
    warnings: {description: Warnings of this instance., type: list}
    errors: {description: Errors of this instance., type: list}
errors:
  description: Every instance's errors, prefixed with the instance name.
  returned: always
  type: list
render_warnings:
  description: Every instance's warnings, prefixed with the instance name (also shown as warnings).
  returned: always
  type: list
spec:
  description: The parsed serve spec (API key masked).
  returned: always
  type: dict
"""
