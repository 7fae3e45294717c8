"""What a host looks like now, for tuning and the probe's report: NUMA memory, hugepages, THP, NUMA balancing,
governor, kernel command line and release, /dev/shm. Parsed from the raw `grep -H` text the roles read."""

from __future__ import annotations

import re
from dataclasses import dataclass

NODE_SYSFS = "/sys/devices/system/node"
THP_SYSFS = "/sys/kernel/mm/transparent_hugepage"
# vLLM's CPU KV tier lives in /dev/shm (>= 0.20: SharedOffloadRegion; >= 0.30 checks the tmpfs's free space).
SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class HostState:
    """What a host looks like now, read from sysfs and procfs (see `parse_host_state`)."""

    node_memory_bytes: dict[int, int]
    hugepages: dict[tuple[int, int], int]  # (node, page size in kB) -> nr_hugepages
    thp_enabled: str | None
    thp_defrag: str | None
    numa_balancing: str | None  # None: the kernel has no such key
    governor: str | None  # None: no cpufreq
    governors_available: tuple[str, ...]
    cmdline: str
    kernel_release: str
    # /proc/meminfo's MemTotal: the nodes' sysfs totals can be far smaller (a VM whose memory is onlined
    # lazily: 4.5 GB on node 0 of a 126 GiB H200 guest), and /dev/shm is limited by the host's total
    memory_bytes: int | None = None
    shm_size_bytes: int | None = None  # None: no tmpfs mounted on /dev/shm (or not read)
    shm_options: tuple[str, ...] = ()
    shmem_thp: bool = False  # the kernel offers transparent hugepages for tmpfs (huge= mount option)

    @property
    def nodes(self) -> list[int]:
        return sorted(self.node_memory_bytes)


def _bracketed(value: str) -> str | None:
    match = re.search(r"\[([^\]]+)\]", value)
    return match.group(1) if match else (value.strip() or None)


def parse_host_state(text: str) -> HostState:
    """Parse `grep -H . <files>` output (one `path:line` per line) of the files the role reads.

    Files: node*/meminfo and /proc/meminfo (MemTotal), node*/hugepages/hugepages-*/nr_hugepages, THP
    enabled/defrag/shmem_enabled, /proc/sys/kernel/numa_balancing, cpu0's scaling_governor and
    scaling_available_governors, /proc/cmdline, /proc/sys/kernel/osrelease, and `/dev/shm:<bytes> <options>`
    from findmnt. A missing file is simply absent.
    """
    memory: dict[int, int] = {}
    hugepages: dict[tuple[int, int], int] = {}
    values: dict[str, str] = {}
    for raw in text.splitlines():
        path, sep, value = raw.partition(":")
        if not sep or not path.startswith("/"):
            continue
        node_mem = re.fullmatch(rf"{NODE_SYSFS}/node(\d+)/meminfo", path)
        if node_mem:
            total = re.match(r"\s*Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB", value)
            if total:
                memory[int(node_mem.group(1))] = int(total.group(1)) * 1024
            continue
        pages = re.fullmatch(rf"{NODE_SYSFS}/node(\d+)/hugepages/hugepages-(\d+)kB/nr_hugepages", path)
        if pages:
            hugepages[(int(pages.group(1)), int(pages.group(2)))] = int(value.strip() or 0)
            continue
        values[path] = value.strip()  # the last line wins (findmnt lists stacked mounts, the top one last)
    shm_size, _, shm_options = values.get(SHM_PATH, "").partition(" ")
    host_total = re.match(r"MemTotal:\s+(\d+)\s*kB", values.get("/proc/meminfo", ""))
    governor = values.get("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    available = values.get("/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors", "")
    return HostState(
        node_memory_bytes=memory,
        hugepages=hugepages,
        thp_enabled=_bracketed(values[f"{THP_SYSFS}/enabled"]) if f"{THP_SYSFS}/enabled" in values else None,
        thp_defrag=_bracketed(values[f"{THP_SYSFS}/defrag"]) if f"{THP_SYSFS}/defrag" in values else None,
        numa_balancing=values.get("/proc/sys/kernel/numa_balancing"),
        governor=governor or None,
        governors_available=tuple(available.split()),
        cmdline=values.get("/proc/cmdline", ""),
        kernel_release=values.get("/proc/sys/kernel/osrelease", ""),
        memory_bytes=int(host_total.group(1)) * 1024 if host_total else None,
        shm_size_bytes=int(shm_size) if shm_size.isdigit() else None,
        shm_options=tuple(o for o in shm_options.split(",") if o),
        shmem_thp=f"{THP_SYSFS}/shmem_enabled" in values,
    )
