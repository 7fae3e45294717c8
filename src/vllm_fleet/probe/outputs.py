"""The probe's verdict on raw host outputs: which outputs are usable, whether the host is CPU-only, and the
readable report (GPUs, links, NUMA, P2P, PCIe links below their maximum, the plan and its reasons).

Used by the `gpu_topology_facts` action plugin; pure functions over text and JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.errors import FleetInputError
from vllm_fleet.probe.topology import RECORDED_COMMANDS, RECORDED_FILES

# Files that come from nvidia-smi: all absent (no nvidia-smi binary) means a host without NVIDIA GPUs.
NVIDIA_SMI_FILES = tuple(name for name, cmd in RECORDED_COMMANDS.items() if cmd.startswith("nvidia-smi"))
FILE_KEYS = {name: key for key, name in RECORDED_FILES.items()}


@dataclass
class CommandResult:
    """What one recorded command gave on the host."""

    name: str  # the recorded file name, e.g. "topo-m.txt"
    rc: int | None  # None: the command could not start (binary missing)
    stdout: str = ""
    stderr: str = ""


@dataclass
class ProbeInputs:
    texts: dict[str, str]  # keyed like RECORDED_FILES (topo_m, p2p_read, ...)
    cpu_only: bool
    notes: list[str] = field(default_factory=list)


def select_outputs(results: list[CommandResult]) -> ProbeInputs:
    """Keep the outputs that worked; decide CPU-only; refuse a host whose nvidia-smi exists but fails.

    A missing nvidia-smi means no NVIDIA driver: a CPU-only host (not a failure). An nvidia-smi that runs and
    fails for the link matrix means a GPU host whose driver is broken: planning it as CPU-only would be wrong.
    """
    texts: dict[str, str] = {}
    notes: list[str] = []
    by_name = {r.name: r for r in results}
    topo = by_name.get(RECORDED_FILES["topo_m"])
    if topo is None or topo.rc is None:
        cpu_only = True
        notes.append("nvidia-smi is not installed: no NVIDIA driver, planned as a CPU-only host")
    elif topo.rc != 0:
        detail = (topo.stderr or topo.stdout).strip().splitlines()
        raise FleetInputError(
            f"nvidia-smi topo -m failed with status {topo.rc} on this host: "
            f"{detail[0] if detail else 'no output'}; the driver is installed but not working "
            "(run playbooks/install.yml, check `nvidia-smi` and `dmesg`), or set gpu_topology_recorded_dir "
            "to plan from recorded outputs"
        )
    else:
        cpu_only = False
    for result in results:
        if cpu_only and result.name in NVIDIA_SMI_FILES:
            continue
        if result.rc == 0 and result.stdout.strip():
            texts[FILE_KEYS[result.name]] = result.stdout
        elif result.rc is None:
            notes.append(f"{RECORDED_COMMANDS[result.name]}: not installed here")
        else:
            first = (result.stderr or result.stdout).strip().splitlines()
            notes.append(
                f"{RECORDED_COMMANDS[result.name]}: status {result.rc}"
                + (f" ({first[0]})" if first else "")
                + ", left out"
            )
    return ProbeInputs(texts=texts, cpu_only=cpu_only, notes=notes)
