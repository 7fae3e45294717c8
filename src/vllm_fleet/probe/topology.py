"""GPU and NUMA topology from raw command output, parsed on the controller.

Every parser takes the text a host printed (or a user pasted, with any surrounding prose, shell
prompts such as `$ nvidia-smi topo -m`, `[rc=0]` trailers, ANSI escapes or a fixture metadata header)
and either returns what the text holds or raises `FleetInputError` naming the input. None of them
returns an empty result for text that is not what it claims to be. `build_topology` merges the parsed
pieces into one `Topology`; `build_topology_from_dir` does the same for a folder of recorded outputs
under the fixed names of `RECORDED_FILES`.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import check_shape
from vllm_fleet.terminal import without_escapes

FIXTURE_SENTINEL = "# ---- verbatim below ----"

# One recorded-hardware folder = these files. The probe role gathers the same names on real hosts.
RECORDED_FILES: dict[str, str] = {
    "topo_m": "topo-m.txt",
    "p2p_read": "topo-p2p-r.txt",
    "p2p_write": "topo-p2p-w.txt",
    "query_gpu": "query-gpu.csv",
    "numactl": "numactl-H.txt",
    "lscpu": "lscpu.txt",
    "sysfs_numa": "sysfs-gpu-numa.txt",
}

# In a recorded folder that stands in for other hardware (no capture of the real box exists): one line saying
# what the recording is and what it stands in for; the plan's first line then says so (`recorded_source`).
STAND_IN_FILE = "stand-in.txt"

QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)

# The command behind each recorded file. Only the sysfs one needs a shell (for its glob).
RECORDED_COMMANDS: dict[str, str] = {
    "topo-m.txt": "nvidia-smi topo -m",
    "topo-p2p-r.txt": "nvidia-smi topo -p2p r",
    "topo-p2p-w.txt": "nvidia-smi topo -p2p w",
    "query-gpu.csv": f"nvidia-smi --query-gpu={','.join(QUERY_GPU_FIELDS)} --format=csv",
    "numactl-H.txt": "numactl --hardware",
    "lscpu.txt": "lscpu",
    "sysfs-gpu-numa.txt": "grep -H . /sys/bus/pci/devices/*/numa_node",
}

P2P_STATUSES: dict[str, str] = {
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "DR": "Disabled by regkey",
    "U": "Unknown",
}

LINK_MEANINGS: dict[str, str] = {
    "SYS": "PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric)",
    "NODE": "PCIe plus the interconnect between PCIe host bridges within one NUMA node",
    "PHB": "PCIe through a PCIe host bridge (the CPU)",
    "PXB": "PCIe through several PCIe bridges, not the host bridge",
    "PIX": "PCIe through at most one PCIe bridge",
    "NV#": "a bonded set of # NVLinks",
}

_LINK_CELL = re.compile(r"X|SYS|NODE|PHB|PXB|PIX|NV\d+")
_LINK_CELLS = re.compile(r"(?:X|SYS|NODE|PHB|PXB|PIX|NV\d+)+")
_HEADER_TOKEN = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|GPU\d+|NIC\d+|\S+")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_CPU_LIST = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
_BUS_ID = re.compile(r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")
_NA = {
    "",
    "N/A",
    "[N/A]",
    "[Not Supported]",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "Not Supported",
}


# --------------------------------------------------------------------------------------------- text helpers


def strip_fixture_header(text: str) -> str:
    """Drop a fixture's `# ` metadata block up to and including the sentinel line (no-op without one)."""
    _head, sep, tail = text.partition(FIXTURE_SENTINEL + "\n")
    if sep:
        return tail
    if text.rstrip("\n").endswith(FIXTURE_SENTINEL):
        return ""
    return text


def csv_cells(line: str) -> list[str]:
    """One row of nvidia-smi's `--format=csv` output, read by `csv` (a quoted field may hold a comma)."""
    return [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True), [])]


def _lines(text: str) -> list[str]:
    """The text's lines without ANSI escapes, fixture metadata, `$ command` prompts and `[rc=N]` trailers."""
    body = strip_fixture_header(without_escapes(text).replace("\r\n", "\n"))
    out = []
    for line in body.split("\n"):
        stripped = line.strip()
        if stripped.startswith("$ ") or re.fullmatch(r"\[rc=-?\d+\]", stripped):
            continue
        out.append(line.rstrip("\n"))
    return out


def _first_words(text: str, limit: int = 60) -> str:
    for line in _lines(text):
        if line.strip():
            snippet = line.strip()
            return snippet if len(snippet) <= limit else snippet[:limit] + "..."
    return "<empty>"


def _na(value: str | None) -> bool:
    return value is None or value.strip() in _NA


def parse_cpu_list(text: str, *, what: str = "CPU list") -> list[int]:
    """`0-11,24-35`, `0 1 2 3`, `0-15 (16)` (numactl --cpu-compress), blank or `N/A` -> sorted CPU numbers."""
    cleaned = re.sub(r"\(\d+\)", " ", text.strip())
    if _na(cleaned):
        return []
    cpus: set[int] = set()
    for part in re.split(r"[,\s]+", cleaned.strip()):
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise FleetInputError(
                f"{what}: {part!r} in {text.strip()!r} is not a CPU number or range; expected a list such as "
                "'0-11,24-35'"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise FleetInputError(f"{what}: range {part!r} runs backwards; expected low-high such as '0-11'")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """[0,1,2,5] -> '0-2,5' (the kernel's own notation)."""
    ordered = sorted(set(cpus))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for cpu in ordered[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = cpu
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def normalize_bus_id(bus_id: str) -> str:
    """nvidia-smi's `00000000:00:06.0` and sysfs's `0000:00:06.0` are one device: keep a 4-digit domain."""
    match = _BUS_ID.search(bus_id.strip())
    if not match:
        raise FleetInputError(f"PCI bus id {bus_id!r} is not of the form 0000:00:06.0")
    domain, rest = match.group(1).split(":", 1)
    return f"{int(domain, 16):04x}:{rest}".lower()


def link_kind(link: str | None) -> str:
    """A topo -m cell's kind: `nvlink`, `sys` (crosses NUMA nodes), `pcie` (same node), `self`, `unknown`."""
    if link is None:
        return "unknown"
    if link == "X":
        return "self"
    if link.startswith("NV"):
        return "nvlink"
    if link == "SYS":
        return "sys"
    return "pcie"


# --------------------------------------------------------------------------------------------- matrices


@dataclass
class _Block:
    header: list[str]
    labels: list[str]
    affinity_columns: list[str]
    rows: dict[str, list[str]]
    row_order: list[str]
    last_line: int


def _header_tokens(line: str) -> list[str] | None:
    tokens = _HEADER_TOKEN.findall(line.strip())
    if not tokens or tokens[0] != "GPU0":
        return None
    seen_affinity = False
    for token in tokens:
        if token in _AFFINITY_COLUMNS:
            seen_affinity = True
        elif seen_affinity or token in P2P_STATUSES or _LINK_CELL.fullmatch(token):
            return None
    return tokens


def _find_blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        tokens = _header_tokens(lines[i])
        if tokens is None or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        labels = [t for t in tokens if t not in _AFFINITY_COLUMNS]
        affinity = [t for t in tokens if t in _AFFINITY_COLUMNS]
        rows: dict[str, list[str]] = {}
        order: list[str] = []
        j = i + 1
        while j < len(lines):
            cells = lines[j].split()
            if not cells or cells[0] not in labels or cells[0] in rows:
                break
            rows[cells[0]] = cells[1:]
            order.append(cells[0])
            j += 1
        if rows:
            blocks.append(_Block(tokens, labels, affinity, rows, order, j - 1))
            i = j
        else:
            i += 1
    return blocks


def _split_link_cells(cells: list[str], count: int) -> tuple[list[str | None], list[str], bool]:
    """Take `count` link cells (splitting glued ones such as `NODENODE`), return (links, rest, complete)."""
    links: list[str | None] = []
    k = 0
    while k < len(cells) and len(links) < count:
        if not _LINK_CELLS.fullmatch(cells[k]):
            break
        links.extend(_LINK_CELL.findall(cells[k]))
        k += 1
    complete = len(links) >= count
    links = links[:count] + [None] * (count - len(links))
    return links, cells[k:], complete


def _is_p2p_block(block: _Block) -> bool:
    cells = [c for row in block.rows.values() for c in row]
    return bool(cells) and all(c in P2P_STATUSES or c == "X" for c in cells) and not block.affinity_columns


@dataclass
class TopoMatrix:
    """What one `nvidia-smi topo -m` printout holds."""

    gpus: list[str]
    nics: list[str]
    nic_names: dict[str, str]
    links: list[list[str | None]]
    nic_links: list[list[str | None]]
    cpu_affinity: list[str | None]
    numa_affinity: list[int | None]
    gpu_numa_id: list[int | None]
    columns: list[str]
    nic_nic_links: list[list[str | None]] = field(default_factory=list)
    missing_rows: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """False when rows of GPUs named in the header are missing (a truncated paste)."""
        return not any(label.startswith("GPU") for label in self.missing_rows)


def _int_or_none(value: str | None, what: str) -> int | None:
    if _na(value):
        return None
    assert value is not None
    try:
        return int(value)
    except ValueError as exc:
        raise FleetInputError(f"{what}: {value!r} is not a number or N/A") from exc


def _assign_affinity(
    values: list[str], columns: list[str], label: str, warnings: list[str]
) -> dict[str, str]:
    if len(values) == len(columns):
        return dict(zip(columns, values, strict=True))
    if len(values) > len(columns):
        warnings.append(
            f"row {label}: {len(values)} affinity cells for {len(columns)} columns; extra cells ignored"
        )
        return dict(zip(columns, values[: len(columns)], strict=True))
    if not values:
        return {}
    # nvidia-smi leaves CPU/NUMA affinity blank (not N/A) when it cannot tell; the cells that remain
    # then belong to the right-hand columns, unless the first one is plainly a CPU list.
    if "," in values[0] or "-" in values[0]:
        assigned = dict(zip(columns, values, strict=False))
    else:
        assigned = dict(zip(columns[len(columns) - len(values) :], values, strict=True))
    warnings.append(f"row {label}: blank affinity cells; read {assigned}")
    return assigned


def parse_topo_matrix(text: str, *, source: str = "nvidia-smi topo -m output") -> TopoMatrix:
    """Parse `nvidia-smi topo -m`: every generation's column set, tabs or spaces, NIC rows, blank/N/A cells.

    `No devices were found` gives a matrix without GPUs (a host without NVIDIA GPUs); anything else without a
    matrix is a FleetInputError.
    """
    lines = _lines(text)
    blocks = _find_blocks(lines)
    topo_blocks = [b for b in blocks if not _is_p2p_block(b)]
    if not topo_blocks:
        if "No devices were found" in text:
            return TopoMatrix([], [], {}, [], [], [], [], [], [])
        if blocks:
            raise FleetInputError(
                f"{source}: this is a `nvidia-smi topo -p2p` matrix (cells such as OK/NS), not `nvidia-smi "
                "topo -m`; "
                "pass it as the P2P input and give the output of `nvidia-smi topo -m` here"
            )
        raise FleetInputError(
            f"{source}: no `nvidia-smi topo -m` matrix found (expected a header line 'GPU0 GPU1 ... CPU "
            "Affinity' "
            f"followed by rows 'GPU0  X ...'; the text starts with {_first_words(text)!r}); capture it with "
            "`nvidia-smi topo -m`"
        )
    block = topo_blocks[0]
    warnings: list[str] = []
    gpus = [label for label in block.labels if re.fullmatch(r"GPU\d+", label)]
    nics = [label for label in block.labels if label not in gpus]
    for position, label in enumerate(gpus):
        if label != f"GPU{position}":
            raise FleetInputError(f"{source}: GPU columns are {gpus}; expected GPU0, GPU1, ... in order")
    ndev = len(block.labels)
    parsed: dict[str, list[str | None]] = {}
    affinity: dict[str, dict[str, str]] = {}
    truncated_rows: list[str] = []
    for label in block.row_order:
        links, rest, complete = _split_link_cells(block.rows[label], ndev)
        if not complete:
            truncated_rows.append(label)
            warnings.append(
                f"row {label} ends after {sum(x is not None for x in links)} of {ndev} link cells"
            )
        diagonal = links[block.labels.index(label)]
        if diagonal not in (None, "X"):
            raise FleetInputError(
                f"{source}: row {label} has {diagonal!r} where its own column should read 'X'; the columns "
                "are "
                "misaligned (a lost or doubled separator?): paste the unmodified `nvidia-smi topo -m` output"
            )
        parsed[label] = links
        if label in gpus:
            affinity[label] = _assign_affinity(rest, block.affinity_columns, label, warnings)
    missing = [label for label in block.labels if label not in parsed]
    if missing:
        warnings.append(f"rows missing (truncated output?): {', '.join(missing)}")
        # When the text stops right after the matrix, its last row may itself be cut mid-cell (`0-23,4`):
        # its trailing cells cannot be trusted.
        last = block.row_order[-1]
        text_ends_here = not any(line.strip().strip("`") for line in lines[block.last_line + 1 :])
        if text_ends_here and affinity.get(last):
            warnings.append(
                f"row {last} is the last row of a truncated matrix: its affinity cells are ignored"
            )
            affinity[last] = {}

    def cell(row: str, col: str) -> str | None:
        value = parsed.get(row, [None] * ndev)[block.labels.index(col)]
        if value is None and col in parsed:
            value = parsed[col][block.labels.index(row)]
        return value

    links = [[cell(a, b) for b in gpus] for a in gpus]
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            other = links[j][i]
            if links[i][j] is not None and other is not None and links[i][j] != other:
                warnings.append(f"link {a}-{b} reads {links[i][j]} one way and {other} the other")
    nic_links = [[cell(a, n) for n in nics] for a in gpus]
    nic_names: dict[str, str] = {}
    for line in lines[block.last_line + 1 :]:
        match = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if match and match.group(1) in nics:
            nic_names[match.group(1)] = match.group(2)
    return TopoMatrix(
        gpus=gpus,
        nics=nics,
        nic_names=nic_names,
        links=links,
        nic_links=nic_links,
        cpu_affinity=[
            None if _na(affinity.get(g, {}).get("CPU Affinity")) else affinity[g]["CPU Affinity"]
            for g in gpus
        ],
        numa_affinity=[
            _int_or_none(affinity.get(g, {}).get("NUMA Affinity"), f"{source}: {g} NUMA Affinity")
            for g in gpus
        ],
        gpu_numa_id=[
            _int_or_none(affinity.get(g, {}).get("GPU NUMA ID"), f"{source}: {g} GPU NUMA ID") for g in gpus
        ],
        columns=list(block.affinity_columns),
        nic_nic_links=[[cell(a, b) for b in nics] for a in nics],
        missing_rows=missing,
        warnings=warnings,
    )


@dataclass
class P2PMatrix:
    """One `nvidia-smi topo -p2p r|w|n|a|rw` matrix: status per GPU pair (`X` on the diagonal)."""

    gpus: list[str]
    status: list[list[str]]
    kind: str | None = None

    def pair(self, i: int, j: int) -> str:
        return self.status[i][j]

    def not_ok(self, indices: Iterable[int]) -> list[tuple[int, int, str]]:
        chosen = sorted(set(indices))
        return [
            (i, j, self.status[i][j]) for i in chosen for j in chosen if i < j and self.status[i][j] != "OK"
        ]


_P2P_KINDS = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "prop", "rw": "read/write"}


def parse_p2p_matrix(
    text: str, *, source: str = "nvidia-smi topo -p2p output", kind: str | None = None
) -> P2PMatrix:
    """Parse `nvidia-smi topo -p2p X` (statuses OK/NS/GNS/CNS/TNS/DR/U), even beside a topo -m block."""
    blocks = [b for b in _find_blocks(_lines(text)) if _is_p2p_block(b)]
    if not blocks:
        raise FleetInputError(
            f"{source}: no `nvidia-smi topo -p2p` matrix found (expected a header 'GPU0 GPU1 ...' and rows "
            "of "
            f"X/OK/NS/GNS/CNS/TNS/DR/U; the text starts with {_first_words(text)!r}); capture it with "
            "`nvidia-smi topo -p2p r`"
        )
    block = blocks[0]
    gpus = block.labels
    missing = [g for g in gpus if g not in block.rows]
    if missing or any(len(block.rows[g]) < len(gpus) for g in gpus):
        raise FleetInputError(
            f"{source}: the P2P matrix is incomplete (rows {missing or 'short'} for columns {gpus}); "
            "paste the whole `nvidia-smi topo -p2p` output"
        )
    status = [block.rows[g][: len(gpus)] for g in gpus]
    for i, row in enumerate(status):
        if row[i] != "X":
            raise FleetInputError(f"{source}: row {gpus[i]} has {row[i]!r} on the diagonal where 'X' belongs")
    if kind is None:
        match = re.search(r"topo\s+-p2p\s+(rw|[rwnap])\b", text)
        kind = _P2P_KINDS.get(match.group(1)) if match else None
    return P2PMatrix(gpus=gpus, status=status, kind=kind)


# --------------------------------------------------------------------------------------------- nvidia-smi CSV


@dataclass
class GpuQueryRow:
    """One row of `nvidia-smi --query-gpu=... --format=csv`."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    memory_total_mib: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    extra: dict[str, str | None] = field(default_factory=dict)


_QUERY_ATTRS = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "pci.bus_id": "bus_id",
    "memory.total": "memory_total_mib",
    "pcie.link.gen.current": "pcie_gen_current",
    "pcie.link.gen.gpucurrent": "pcie_gen_current",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.gen.gpumax": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width_current",
    "pcie.link.width.max": "pcie_width_max",
}
_QUERY_INTS = {
    "index",
    "memory_total_mib",
    "pcie_gen_current",
    "pcie_gen_max",
    "pcie_width_current",
    "pcie_width_max",
}


def _csv_number(value: str, what: str) -> int | None:
    if _na(value):
        return None
    match = re.fullmatch(r"(\d+)(?:\.0+)?\s*(?:MiB|x)?", value.strip())
    if not match:
        raise FleetInputError(f"{what}: {value!r} is not a whole number")
    return int(match.group(1))


def parse_query_gpu_csv(
    text: str, *, fields: Iterable[str] | None = None, source: str = "nvidia-smi --query-gpu output"
) -> list[GpuQueryRow]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`.

    The field list comes from the CSV header, else from a `--query-gpu=...` command line in the text,
    else from `fields`, else `QUERY_GPU_FIELDS`. `No devices were found` gives an empty list.
    """
    lines = [line.strip() for line in _lines(text)]
    names: list[str] | None = None
    body: list[str] = []
    header_seen = False
    for line in lines:
        if header_seen and "," not in line:
            break  # the CSV block after a header ends at the first other line
        if "," not in line or line.startswith("#"):
            continue
        cells = csv_cells(line)
        header = [re.sub(r"\s*\[[^\]]*\]$", "", c) for c in cells]
        if (
            names is None
            and all(re.fullmatch(r"[a-z_]+(?:\.[a-z_]+)*", h) for h in header)
            and ("index" in header or "pci.bus_id" in header or "name" in header)
        ):
            names, header_seen, body = header, True, []
            continue
        body.append(line)
    if names is None:
        match = re.search(r"--query-gpu[= ]([\w.,]+)", text)
        names = match.group(1).split(",") if match else list(fields or QUERY_GPU_FIELDS)
    if not body:
        if "No devices were found" in text:
            return []
        raise FleetInputError(
            f"{source}: no CSV rows found (the text starts with {_first_words(text)!r}); capture it with "
            f"`{RECORDED_COMMANDS['query-gpu.csv']}`"
        )
    rows: list[GpuQueryRow] = []
    for line in body:
        cells = csv_cells(line)
        if len(cells) != len(names):
            # A GPU name never contains a comma, so a wrong count means text that is not a row of this CSV.
            if re.match(r"^\d+\s*,", line):
                raise FleetInputError(
                    f"{source}: row {line!r} has {len(cells)} fields but the field list {names} has "
                    f"{len(names)}: captured with a different --query-gpu list? pass the matching header "
                    "(omit noheader)"
                )
            continue
        values = dict(zip(names, cells, strict=True))
        # nvidia-smi prints GPUs in index order, so a query without `index` still numbers them.
        kwargs: dict[str, Any] = {"extra": {}, "index": len(rows)}
        for name, value in values.items():
            attr = _QUERY_ATTRS.get(name)
            if attr is None:
                kwargs["extra"][name] = None if _na(value) else value
            elif attr in _QUERY_INTS:
                kwargs[attr] = _csv_number(value, f"{source}: {name}")
            elif attr == "bus_id":
                kwargs[attr] = None if _na(value) else normalize_bus_id(value)
            else:
                kwargs[attr] = None if _na(value) else value
        if kwargs.get("index") is None:
            raise FleetInputError(f"{source}: row {line!r} has no GPU index")
        rows.append(GpuQueryRow(**kwargs))
    if not rows:
        raise FleetInputError(
            f"{source}: no row matches the {len(names)} fields {names}; captured with a different field list?"
        )
    rows.sort(key=lambda r: r.index)
    return rows


# --------------------------------------------------------------------------------------------- numactl, lscpu


@dataclass
class NumaNode:
    id: int
    cpus: list[int]
    memory_mb: int | None = None
    free_mb: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "cpus": self.cpus, "memory_mb": self.memory_mb, "free_mb": self.free_mb}


@dataclass
class NumaHardware:
    """`numactl --hardware`: nodes (CPU-less and memoryless ones included) and the distance table."""

    nodes: list[NumaNode]
    distances: dict[int, dict[int, int]] = field(default_factory=dict)
    available: bool = True


def _parse_node_ids(text: str) -> list[int]:
    return parse_cpu_list(text, what="numactl node id list")


def parse_numactl_hardware(text: str, *, source: str = "numactl --hardware output") -> NumaHardware:
    """Parse `numactl --hardware`/`-H` (also `--cpu-compress`, CPU-less/memoryless nodes, odd node ids)."""
    lines = _lines(text)
    declared: list[int] | None = None
    cpus: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    free: dict[int, int] = {}
    distances: dict[int, dict[int, int]] = {}
    columns: list[int] = []
    for line in lines:
        stripped = line.strip()
        if match := re.fullmatch(r"available:\s*(\d+)\s+nodes?\s*\(([^)]*)\)", stripped):
            declared = _parse_node_ids(match.group(2))
            if len(declared) != int(match.group(1)):
                raise FleetInputError(
                    f"{source}: {stripped!r} counts {match.group(1)} nodes but lists {declared}"
                )
        elif match := re.fullmatch(r"node\s+(\d+)\s+cpus:(.*)", stripped):
            cpus[int(match.group(1))] = parse_cpu_list(
                match.group(2), what=f"{source}: node {match.group(1)} cpus"
            )
        elif match := re.fullmatch(r"node\s+(\d+)\s+size:\s*(\d+)\s*MB", stripped):
            sizes[int(match.group(1))] = int(match.group(2))
        elif match := re.fullmatch(r"node\s+(\d+)\s+free:\s*(\d+)\s*MB", stripped):
            free[int(match.group(1))] = int(match.group(2))
        elif match := re.fullmatch(r"node((?:\s+\d+)+)", stripped):
            columns = [int(x) for x in match.group(1).split()]
        elif columns and (match := re.fullmatch(r"(\d+):((?:\s+\d+)+)", stripped)):
            values = [int(x) for x in match.group(2).split()]
            if len(values) == len(columns):
                distances[int(match.group(1))] = dict(zip(columns, values, strict=True))
    if declared is None and not cpus:
        if "No NUMA available" in text:
            return NumaHardware(nodes=[], available=False)
        raise FleetInputError(
            f"{source}: no 'available: N nodes' line and no 'node N cpus:' lines (the text starts with "
            f"{_first_words(text)!r}); capture it with `numactl --hardware`"
        )
    ids = declared if declared is not None else sorted(cpus)
    missing = [n for n in ids if n not in cpus]
    if missing:
        raise FleetInputError(
            f"{source}: nodes {missing} are declared but have no 'node N cpus:' line (truncated output?); "
            "paste the whole `numactl --hardware` output"
        )
    nodes = [NumaNode(id=n, cpus=cpus[n], memory_mb=sizes.get(n), free_mb=free.get(n)) for n in ids]
    return NumaHardware(nodes=nodes, distances=distances)


@dataclass
class LscpuInfo:
    """The parts of `lscpu` that placement needs."""

    cpus: int | None = None
    online: list[int] = field(default_factory=list)
    offline: list[int] = field(default_factory=list)
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    numa_node_count: int | None = None
    numa_nodes: dict[int, list[int]] = field(default_factory=dict)
    model_name: str | None = None
    architecture: str | None = None
    hypervisor: str | None = None

    @property
    def complete(self) -> bool:
        """False when `NUMA node(s)` announces more nodes than the text lists (a partial paste)."""
        return self.numa_node_count is None or self.numa_node_count == len(self.numa_nodes)


def _lscpu_pairs(text: str) -> list[tuple[str, str]]:
    body = "\n".join(_lines(text)).strip()
    if body.startswith("{"):
        try:
            document = json.loads(body)
        except json.JSONDecodeError as exc:
            raise FleetInputError(
                f"lscpu -J output: not valid JSON ({exc.msg} at line {exc.lineno})"
            ) from exc
        pairs: list[tuple[str, str]] = []

        def walk(entries: Any) -> None:
            for entry in entries or []:
                if isinstance(entry, dict) and "field" in entry:
                    pairs.append((str(entry["field"]).rstrip(":").strip(), str(entry.get("data") or "")))
                    walk(entry.get("children"))

        walk(document.get("lscpu") if isinstance(document, dict) else None)
        return pairs
    pairs = []
    for line in body.split("\n"):
        match = re.match(r"^\s*([A-Za-z][^:]*?):\s*(.*?)\s*$", line)
        if match:
            pairs.append((match.group(1).strip(), match.group(2)))
    return pairs


def parse_lscpu(text: str, *, source: str = "lscpu output") -> LscpuInfo:
    """Parse `lscpu` (old flat and new sectioned layouts, `lscpu -J` JSON), partial pastes included."""
    info = LscpuInfo()
    known = 0

    def number(value: str, key: str) -> int | None:
        match = re.match(r"^\s*(\d+)\s*$", value)
        if not match:
            if _na(value):
                return None
            raise FleetInputError(f"{source}: {key} is {value!r}, not a number")
        return int(match.group(1))

    for key, value in _lscpu_pairs(text):
        if match := re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key):
            info.numa_nodes[int(match.group(1))] = parse_cpu_list(value, what=f"{source}: {key}")
        elif key == "CPU(s)":
            info.cpus = number(value, key)
        elif key == "On-line CPU(s) list":
            info.online = parse_cpu_list(value, what=f"{source}: {key}")
        elif key == "Off-line CPU(s) list":
            info.offline = parse_cpu_list(value, what=f"{source}: {key}")
        elif key == "Socket(s)":
            info.sockets = number(value, key)
        elif key == "Core(s) per socket":
            info.cores_per_socket = number(value, key)
        elif key == "Thread(s) per core":
            info.threads_per_core = number(value, key)
        elif key == "NUMA node(s)":
            info.numa_node_count = number(value, key)
        elif key == "Model name":
            info.model_name = value
        elif key == "Architecture":
            info.architecture = value
        elif key == "Hypervisor vendor":
            info.hypervisor = value
        else:
            continue
        known += 1
    if not known:
        raise FleetInputError(
            f"{source}: no lscpu fields found (expected lines such as 'CPU(s): 32' or 'NUMA node0 CPU(s): "
            "0-31'; "
            f"the text starts with {_first_words(text)!r}); capture it with `lscpu`"
        )
    return info


def parse_sysfs_numa(text: str, *, source: str = "sysfs numa_node values") -> dict[str, int | None]:
    """PCI bus id -> NUMA node from sysfs (`-1` -> None: the kernel does not know).

    Accepts `grep -H . /sys/bus/pci/devices/*/numa_node` (`.../0000:00:06.0/numa_node:-1`), `<bus id> <node>`
    lines, and blocks headed `== <bus id> -> <path>` whose first bare integer line is the device's numa_node.
    """
    result: dict[str, int | None] = {}
    block_bus: str | None = None
    for line in _lines(text):
        stripped = line.strip()
        if match := re.search(_BUS_ID.pattern + r"/numa_node:\s*(-?\d+)\s*$", stripped):
            node = int(match.group(2))
            result[normalize_bus_id(match.group(1))] = node if node >= 0 else None
        elif stripped.startswith("==") and (match := _BUS_ID.search(stripped)):
            block_bus = normalize_bus_id(match.group(1))
        elif block_bus and re.fullmatch(r"-?\d+", stripped):
            node = int(stripped)
            result[block_bus] = node if node >= 0 else None
            block_bus = None
        elif match := re.fullmatch(_BUS_ID.pattern + r"\s*[:=\s]\s*(-?\d+)", stripped):
            node = int(match.group(2))
            result[normalize_bus_id(match.group(1))] = node if node >= 0 else None
    if not result:
        raise FleetInputError(
            f"{source}: no PCI device numa_node values found (the text starts with {_first_words(text)!r}); "
            f"capture them with `{RECORDED_COMMANDS['sysfs-gpu-numa.txt']}`"
        )
    return result


# ------------------------------------------------------------------------------------------ the merged view


@dataclass
class Gpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    memory_mib: int | None = None
    cpus: list[int] = field(default_factory=list)
    cpu_affinity: str | None = None
    numa_node: int | None = None
    numa_source: str = "unknown"
    gpu_numa_id: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None

    def pcie_below_max(self) -> list[str]:
        """What runs below its maximum, e.g. ['gen 1 of 4', 'x8 of x16']; empty when unknown or at max."""
        below = []
        if self.pcie_gen_current and self.pcie_gen_max and self.pcie_gen_current < self.pcie_gen_max:
            below.append(f"gen {self.pcie_gen_current} of {self.pcie_gen_max}")
        if self.pcie_width_current and self.pcie_width_max and self.pcie_width_current < self.pcie_width_max:
            below.append(f"x{self.pcie_width_current} of x{self.pcie_width_max}")
        return below

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "bus_id": self.bus_id,
            "memory_mib": self.memory_mib,
            "cpus": self.cpus,
            "cpu_affinity": self.cpu_affinity,
            "numa_node": self.numa_node,
            "numa_source": self.numa_source,
            "gpu_numa_id": self.gpu_numa_id,
            "pcie": {
                "gen_current": self.pcie_gen_current,
                "gen_max": self.pcie_gen_max,
                "width_current": self.pcie_width_current,
                "width_max": self.pcie_width_max,
                "below_max": self.pcie_below_max(),
            },
        }


# The JSON shape of Topology.to_dict(), as from_dict reads it back (None where a probe may not know).
_TOPOLOGY_HINTS: dict[str, Any] = {
    "gpus": list[Any] | None,
    "links": list[list[str | None]] | None,
    "nics": list[str] | None,
    "nic_names": dict[str, str] | None,
    "nic_links": list[list[str | None]] | None,
    "p2p_read": list[list[str]] | None,
    "p2p_write": list[list[str]] | None,
    "numa_nodes": list[Any] | None,
    "numa_distances": dict[str, dict[str, int]] | None,
    "sockets": int | None,
    "cpu_count": int | None,
    "cpu_model": str | None,
    "hypervisor": str | None,
    "warnings": list[str] | None,
    "missing_rows": list[str] | None,
}
_GPU_HINTS: dict[str, Any] = {
    "index": int,
    "name": str | None,
    "uuid": str | None,
    "bus_id": str | None,
    "memory_mib": int | None,
    "cpus": list[int] | None,
    "cpu_affinity": str | None,
    "numa_node": int | None,
    "numa_source": str,
    "gpu_numa_id": int | None,
    "pcie": dict[str, Any] | None,
}
_PCIE_HINTS: dict[str, Any] = {
    "gen_current": int | None,
    "gen_max": int | None,
    "width_current": int | None,
    "width_max": int | None,
}
_NUMA_NODE_HINTS: dict[str, Any] = {
    "id": int,
    "cpus": list[int] | None,
    "memory_mb": int | None,
    "free_mb": int | None,
}


@dataclass
class Topology:
    """One host: GPUs, how they are joined, P2P, NUMA nodes. `to_dict()` is the JSON of DESIGN §4."""

    gpus: list[Gpu] = field(default_factory=list)
    links: list[list[str | None]] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)
    nic_names: dict[str, str] = field(default_factory=dict)
    nic_links: list[list[str | None]] = field(default_factory=list)
    p2p_read: P2PMatrix | None = None
    p2p_write: P2PMatrix | None = None
    numa_nodes: list[NumaNode] = field(default_factory=list)
    numa_distances: dict[int, dict[int, int]] = field(default_factory=dict)
    sockets: int | None = None
    cpu_count: int | None = None
    cpu_model: str | None = None
    hypervisor: str | None = None
    warnings: list[str] = field(default_factory=list)
    missing_rows: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """False when the topo -m matrix lost GPU rows (links between some GPUs unknown)."""
        return not any(r.startswith("GPU") for r in self.missing_rows)

    @property
    def cpu_only(self) -> bool:
        """A host without GPUs gets one instance on vLLM's CPU backend: the one place this is decided."""
        return not self.gpus

    @property
    def numa_known(self) -> bool:
        return bool(self.gpus) and all(g.numa_node is not None for g in self.gpus)

    def link(self, i: int, j: int) -> str | None:
        if i == j:
            return "X"
        return self.links[i][j] if self.links else None

    def p2p_status(self, i: int, j: int) -> str | None:
        """The worse of read and write P2P for a pair; None when no P2P matrix was given."""
        statuses = [m.status[i][j] for m in (self.p2p_read, self.p2p_write) if m is not None]
        if not statuses:
            return None
        bad = [s for s in statuses if s != "OK"]
        return bad[0] if bad else "OK"

    def p2p_matrix(self) -> list[list[str]] | None:
        if self.p2p_read is None and self.p2p_write is None:
            return None
        n = len(self.gpus)
        return [["X" if i == j else (self.p2p_status(i, j) or "U") for j in range(n)] for i in range(n)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_dict() for g in self.gpus],
            "links": self.links,
            "nics": self.nics,
            "nic_names": self.nic_names,
            "nic_links": self.nic_links,
            "p2p": self.p2p_matrix(),
            "p2p_read": self.p2p_read.status if self.p2p_read else None,
            "p2p_write": self.p2p_write.status if self.p2p_write else None,
            "numa_nodes": [n.to_dict() for n in self.numa_nodes],
            "numa_distances": {
                str(k): {str(a): b for a, b in v.items()} for k, v in self.numa_distances.items()
            },
            "numa_known": self.numa_known,
            "sockets": self.sockets,
            "cpu_count": self.cpu_count,
            "cpu_model": self.cpu_model,
            "hypervisor": self.hypervisor,
            "complete": self.complete,
            "missing_rows": self.missing_rows,
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], fix: str = "run playbooks/probe.yml again") -> Topology:
        """Rebuild a Topology from `to_dict()` output (e.g. the `gpu_topology.topology` fact, a saved probe
        report). Every field the layout reads is type-checked first: a report edited by hand (or damaged)
        is a FleetInputError naming the field and the value, never an exception deep in the planner."""
        check_shape(data, _TOPOLOGY_HINTS, "topology", fix)
        for index, gpu in enumerate(data.get("gpus") or []):
            check_shape({"gpu": gpu}, {"gpu": dict[str, Any]}, f"topology gpus[{index}]", fix)
            check_shape(gpu, _GPU_HINTS, f"topology gpus[{index}]", fix)
            check_shape(gpu.get("pcie") or {}, _PCIE_HINTS, f"topology gpus[{index}].pcie", fix)
        for index, node in enumerate(data.get("numa_nodes") or []):
            check_shape({"node": node}, {"node": dict[str, Any]}, f"topology numa_nodes[{index}]", fix)
            check_shape(node, _NUMA_NODE_HINTS, f"topology numa_nodes[{index}]", fix)
        gpus = []
        for g in data.get("gpus") or []:
            pcie = g.get("pcie") or {}
            gpus.append(
                Gpu(
                    index=int(g["index"]),
                    name=g.get("name"),
                    uuid=g.get("uuid"),
                    bus_id=g.get("bus_id"),
                    memory_mib=g.get("memory_mib"),
                    cpus=list(g.get("cpus") or []),
                    cpu_affinity=g.get("cpu_affinity"),
                    numa_node=g.get("numa_node"),
                    numa_source=g.get("numa_source", "unknown"),
                    gpu_numa_id=g.get("gpu_numa_id"),
                    pcie_gen_current=pcie.get("gen_current"),
                    pcie_gen_max=pcie.get("gen_max"),
                    pcie_width_current=pcie.get("width_current"),
                    pcie_width_max=pcie.get("width_max"),
                )
            )
        labels = [f"GPU{g.index}" for g in gpus]
        return cls(
            gpus=gpus,
            links=[list(r) for r in data.get("links") or []],
            nics=list(data.get("nics") or []),
            nic_names=dict(data.get("nic_names") or {}),
            nic_links=[list(r) for r in data.get("nic_links") or []],
            p2p_read=P2PMatrix(labels, data["p2p_read"], "read") if data.get("p2p_read") else None,
            p2p_write=P2PMatrix(labels, data["p2p_write"], "write") if data.get("p2p_write") else None,
            numa_nodes=[
                NumaNode(int(n["id"]), list(n.get("cpus") or []), n.get("memory_mb"), n.get("free_mb"))
                for n in data.get("numa_nodes") or []
            ],
            numa_distances={
                int(k): {int(a): int(b) for a, b in v.items()}
                for k, v in (data.get("numa_distances") or {}).items()
            },
            sockets=data.get("sockets"),
            cpu_count=data.get("cpu_count"),
            cpu_model=data.get("cpu_model"),
            hypervisor=data.get("hypervisor"),
            warnings=list(data.get("warnings") or []),
            missing_rows=list(data.get("missing_rows") or []),
        )


def _sysfs_values(
    sysfs_numa: str | None, sysfs_numa_nodes: Mapping[str, Any] | None
) -> dict[str, int | None]:
    values: dict[str, int | None] = {}
    if sysfs_numa is not None:
        values.update(parse_sysfs_numa(sysfs_numa))
    for bus, raw in (sysfs_numa_nodes or {}).items():
        try:
            node = int(str(raw).strip())
        except ValueError as exc:
            raise FleetInputError(
                f"sysfs_numa_nodes[{bus!r}] is {raw!r}: expected the integer in .../numa_node (-1 = unknown)"
            ) from exc
        values[normalize_bus_id(bus)] = node if node >= 0 else None
    return values


def _resolve_numa(
    gpu: Gpu,
    topo_numa: int | None,
    sysfs: dict[str, int | None],
    nodes: list[NumaNode],
    warnings: list[str],
) -> None:
    if sysfs:
        if gpu.bus_id and gpu.bus_id in sysfs:
            node = sysfs[gpu.bus_id]
            if node is None:
                gpu.numa_node = None
                gpu.numa_source = (
                    f"unknown: sysfs numa_node is -1 for {gpu.bus_id} (the kernel has no NUMA information "
                    "for "
                    "this device, typical of a virtual machine)"
                    + (
                        f"; nvidia-smi's NUMA Affinity {topo_numa} is not trusted"
                        if topo_numa is not None
                        else ""
                    )
                )
                return
            if topo_numa is not None and topo_numa != node:
                warnings.append(
                    f"GPU{gpu.index}: sysfs numa_node {node} but topo -m NUMA Affinity {topo_numa}; "
                    "using sysfs"
                )
            gpu.numa_node, gpu.numa_source = node, f"sysfs numa_node of {gpu.bus_id}"
            return
        if not gpu.bus_id and all(v is None for v in sysfs.values()):
            gpu.numa_node = None
            gpu.numa_source = (
                "unknown: every PCI device's sysfs numa_node is -1 (no NUMA information, e.g. a VM)"
            )
            return
    if topo_numa is not None:
        gpu.numa_node, gpu.numa_source = topo_numa, "nvidia-smi topo -m NUMA Affinity"
        return
    if gpu.cpus and nodes:
        touching = [n.id for n in nodes if set(n.cpus) & set(gpu.cpus)]
        if len(touching) == 1:
            gpu.numa_node = touching[0]
            gpu.numa_source = f"CPU affinity {gpu.cpu_affinity} lies in NUMA node {touching[0]}"
            return
        if touching:
            gpu.numa_source = f"unknown: CPU affinity {gpu.cpu_affinity} spans NUMA nodes {touching}"
            return
    gpu.numa_source = "unknown: no NUMA affinity in topo -m and no sysfs numa_node value"


def build_topology(
    *,
    topo_m: str | None = None,
    p2p: str | None = None,
    p2p_write: str | None = None,
    numactl: str | None = None,
    lscpu: str | None = None,
    query_gpu: str | None = None,
    sysfs_numa: str | None = None,
    sysfs_numa_nodes: Mapping[str, Any] | None = None,
    query_gpu_fields: Iterable[str] | None = None,
    allow_incomplete: bool = False,
) -> Topology:
    """Merge raw outputs into one Topology. Any may be None; no GPU input at all means a host without GPUs.

    `p2p` is `topo -p2p r` (or `rw`), `p2p_write` is `topo -p2p w`; `sysfs_numa` is raw text (see
    `parse_sysfs_numa`), `sysfs_numa_nodes` the same as a {bus id: "-1"} mapping. A topo -m matrix with
    missing GPU rows (a truncated paste) is refused unless `allow_incomplete`; then `Topology.complete` is
    False and `plan_layout` refuses it.
    """
    warnings: list[str] = []
    matrix = parse_topo_matrix(topo_m, source="topo -m") if topo_m is not None else None
    if matrix is not None:
        if not matrix.complete and not allow_incomplete:
            raise FleetInputError(
                f"topo -m: the matrix is truncated: rows {', '.join(matrix.missing_rows)} are missing, so "
                "the links between those GPUs are unknown; paste the whole `nvidia-smi topo -m` output"
            )
        warnings.extend(f"topo -m: {w}" for w in matrix.warnings)
        if p2p is None:
            # A pasted report often carries the P2P matrix right under topo -m (club-3090 rig reports).
            try:
                p2p = _p2p_text_inside(topo_m)
            except FleetInputError:
                p2p = None
    rows = parse_query_gpu_csv(query_gpu, fields=query_gpu_fields, source="query-gpu") if query_gpu else []
    count = len(matrix.gpus) if matrix is not None else len(rows)
    if matrix is not None and rows and len(rows) != count:
        raise FleetInputError(
            f"query-gpu lists {len(rows)} GPUs but topo -m shows {count}: were they captured on different "
            "hosts, or "
            "with CUDA_VISIBLE_DEVICES set? capture both on the same host"
        )
    if rows and [r.index for r in rows] != list(range(count)):
        raise FleetInputError(f"query-gpu: GPU indices {[r.index for r in rows]}; expected 0..{count - 1}")
    hardware = parse_numactl_hardware(numactl, source="numactl") if numactl is not None else None
    cpu_info = parse_lscpu(lscpu, source="lscpu") if lscpu is not None else None
    if cpu_info is not None and not cpu_info.complete:
        warnings.append(
            f"lscpu: announces {cpu_info.numa_node_count} NUMA nodes but lists "
            f"{len(cpu_info.numa_nodes)} (partial output)"
        )
    if hardware is not None and hardware.nodes:
        nodes = hardware.nodes
    elif cpu_info is not None and cpu_info.numa_nodes:
        nodes = [NumaNode(id=k, cpus=v) for k, v in sorted(cpu_info.numa_nodes.items())]
    else:
        nodes = []
    sysfs = _sysfs_values(sysfs_numa, sysfs_numa_nodes)
    gpus: list[Gpu] = []
    for i in range(count):
        row = rows[i] if rows else None
        gpu = Gpu(index=i)
        if row is not None:
            gpu.name, gpu.uuid, gpu.bus_id, gpu.memory_mib = (
                row.name,
                row.uuid,
                row.bus_id,
                row.memory_total_mib,
            )
            gpu.pcie_gen_current, gpu.pcie_gen_max = row.pcie_gen_current, row.pcie_gen_max
            gpu.pcie_width_current, gpu.pcie_width_max = row.pcie_width_current, row.pcie_width_max
        topo_numa = None
        if matrix is not None:
            gpu.cpu_affinity = matrix.cpu_affinity[i]
            gpu.cpus = parse_cpu_list(gpu.cpu_affinity or "", what=f"topo -m GPU{i} CPU Affinity")
            topo_numa = matrix.numa_affinity[i]
            gpu.gpu_numa_id = matrix.gpu_numa_id[i]
        _resolve_numa(gpu, topo_numa, sysfs, nodes, warnings)
        if gpu.numa_node is not None and nodes and gpu.numa_node not in {n.id for n in nodes}:
            warnings.append(
                f"GPU{i}: NUMA node {gpu.numa_node} is not among the host's nodes {[n.id for n in nodes]}"
            )
        gpus.append(gpu)
    p2p_read = parse_p2p_matrix(p2p, source="topo -p2p (read)") if p2p is not None else None
    p2p_w = parse_p2p_matrix(p2p_write, source="topo -p2p w", kind="write") if p2p_write is not None else None
    for name, m in (("topo -p2p (read)", p2p_read), ("topo -p2p w", p2p_w)):
        if m is not None and len(m.gpus) != count:
            raise FleetInputError(
                f"{name}: the matrix has {len(m.gpus)} GPUs but the host has {count}; "
                "capture both on the same host"
            )
    return Topology(
        gpus=gpus,
        links=matrix.links if matrix is not None else [],
        nics=list(matrix.nics) if matrix is not None else [],
        nic_names=matrix.nic_names if matrix is not None else {},
        nic_links=matrix.nic_links if matrix is not None else [],
        p2p_read=p2p_read,
        p2p_write=p2p_w,
        numa_nodes=nodes,
        numa_distances=hardware.distances if hardware is not None else {},
        sockets=cpu_info.sockets if cpu_info else None,
        cpu_count=cpu_info.cpus if cpu_info else None,
        cpu_model=cpu_info.model_name if cpu_info else None,
        hypervisor=cpu_info.hypervisor if cpu_info else None,
        warnings=warnings,
        missing_rows=list(matrix.missing_rows) if matrix is not None else [],
    )


def _p2p_text_inside(text: str) -> str | None:
    """The text itself when it also holds a `topo -p2p` matrix, else None."""
    parse_p2p_matrix(text)
    return text


def read_recorded_dir(path: str | Path) -> dict[str, str]:
    """The texts of a recorded-hardware folder, keyed like `RECORDED_FILES` (absent files left out)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FleetInputError(
            f"recorded-hardware folder {str(folder)!r} does not exist or is not a folder; expected a folder "
            "with "
            f"some of {sorted(RECORDED_FILES.values())}"
        )
    texts = {}
    for key, name in RECORDED_FILES.items():
        file = folder / name
        if file.is_file():
            texts[key] = file.read_text(encoding="utf-8", errors="replace")
    if not texts:
        raise FleetInputError(
            f"recorded-hardware folder {str(folder)!r} holds none of {sorted(RECORDED_FILES.values())}; "
            "record "
            "them with the commands in vllm_fleet.probe.topology.RECORDED_COMMANDS"
        )
    return texts


def recorded_source(path: str | Path) -> str:
    """Where a plan's facts came from, for its first line: `recorded: DIR`; when the folder is not a capture
    of the hardware it plans but stands in for it (its `STAND_IN_FILE` says what it is and why), that first
    (issue 32: the seed's 4 x 4090 example planned 8 GPUs of another box and only a README said so)."""
    note = Path(path) / STAND_IN_FILE
    if not note.is_file():
        return f"recorded: {path}"
    lines = [line.strip() for line in note.read_text(encoding="utf-8", errors="replace").splitlines()]
    why = next((line for line in lines if line), "no reason given")
    return f"STAND-IN, not this host's hardware: {why}; recorded: {path}"


def build_topology_from_texts(texts: Mapping[str, str], *, allow_incomplete: bool = False) -> Topology:
    """`build_topology` over raw outputs keyed like `RECORDED_FILES` (`topo_m`, `p2p_read`, ...)."""
    unknown = sorted(set(texts) - set(RECORDED_FILES))
    if unknown:
        raise FleetInputError(f"topology inputs {unknown} are not among {sorted(RECORDED_FILES)}")
    return build_topology(
        topo_m=texts.get("topo_m"),
        p2p=texts.get("p2p_read"),
        p2p_write=texts.get("p2p_write"),
        numactl=texts.get("numactl"),
        lscpu=texts.get("lscpu"),
        query_gpu=texts.get("query_gpu"),
        sysfs_numa=texts.get("sysfs_numa"),
        allow_incomplete=allow_incomplete,
    )


def build_topology_from_dir(path: str | Path) -> Topology:
    """`build_topology` over a recorded-hardware folder (file names: `RECORDED_FILES`)."""
    return build_topology_from_texts(read_recorded_dir(path))
