"""vllm_fleet.probe.topology over real recorded outputs: tests/fixtures/topology (public issue threads,
source in
each file's header), tests/fixtures/gpu-host-h200x2 and topology/recorded/h200x2 (real 2 x H200 captures).

Expected values are the rows of the shared fixtures' INDEX.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.probe.topology import (
    RECORDED_COMMANDS,
    RECORDED_FILES,
    Topology,
    build_topology,
    build_topology_from_dir,
    build_topology_from_texts,
    format_cpu_list,
    link_kind,
    normalize_bus_id,
    parse_cpu_list,
    parse_lscpu,
    parse_numactl_hardware,
    parse_p2p_matrix,
    parse_query_gpu_csv,
    parse_sysfs_numa,
    parse_topo_matrix,
    strip_fixture_header,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOPO = FIXTURES / "topology"
H200 = FIXTURES / "gpu-host-h200x2"
RECORDED = TOPO / "recorded"


def raw(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def body(name: str) -> str:
    """A shared-collection fixture without its `# ` metadata block."""
    text = raw(TOPO / name)
    assert "# ---- verbatim below ----" in text
    return strip_fixture_header(text)


def all_off_diagonal(links: list[list[str | None]], value: str, rows: range | None = None) -> bool:
    indices = rows if rows is not None else range(len(links))
    return all(links[i][j] == value for i in indices for j in range(len(links)) if i != j)


V100 = "topo-16xV100-dgx2-nv6-mlx5-columns-cpu-affinity-only-nccl-tests-78-TRUNCATED.txt"
ONE_5090 = "topo-1x5090-2nic-tabs-vllm-21028.txt"
MANGLED = "topo-2gpu-node-indented-wrapped-club3090-1125.txt"
TWO_3090 = "topo-2x3090-phb-patched-p2p-tabs-club3090-922.txt"
TWO_5090 = "topo-2x5090-threadripper-phb-tabs-club3090-1229.txt"
FOUR_GPU = "topo-4gpu-pxb-pix-sys-no-gpunumaid-tabs-nccl-667.txt"
L40S = "topo-4xL40S-dualsocket-384cpu-2nic-nic-legend-miss-alignment-106.txt"
NV18_22372 = "topo-8gpu-nv18-8nic-trailing-tabs-vllm-22372-TRUNCATED.txt"
RTX4090_8 = "topo-8x4090-dualsocket-2nic-tabs-gpuallocator-17.txt"
H100_1453 = "topo-8xH100-nv18-9nic-tabs-nccl-1453-TRUNCATED.txt"
TOPO_FILES = [V100, ONE_5090, MANGLED, TWO_3090, TWO_5090, FOUR_GPU, L40S, NV18_22372, RTX4090_8, H100_1453]


# ------------------------------------------------------------------------------------ nvidia-smi topo -m


def test_v100_dgx2_truncated_oldest_format() -> None:
    m = parse_topo_matrix(body(V100))
    assert m.gpus == [f"GPU{i}" for i in range(16)]
    assert m.nics == [f"mlx5_{i}" for i in range(10)]
    assert m.columns == ["CPU Affinity"]
    assert all_off_diagonal(m.links, "NV6", range(5))
    assert m.nic_links[0][:2] == ["PIX", "PXB"] and m.nic_links[1][:2] == ["PIX", "PXB"]
    assert m.nic_links[2][:2] == ["PXB", "PIX"] and m.nic_links[3][:2] == ["PXB", "PIX"]
    assert m.nic_links[4][2] == "PIX"
    assert m.cpu_affinity[:4] == ["0-23,48-71"] * 4
    assert m.numa_affinity == [None] * 16
    # Truncation: rows GPU5..GPU15 are missing, and the cut GPU4 row's affinity ("0-23,4") is not trusted.
    assert not m.complete
    assert m.missing_rows[:11] == [f"GPU{i}" for i in range(5, 16)]
    assert m.cpu_affinity[4] is None
    assert m.links[5][6] is None and m.links[5][0] == "NV6"  # known by symmetry from GPU0's row
    with pytest.raises(FleetInputError, match=r"truncated.*GPU5"):
        build_topology(topo_m=body(V100))
    partial = build_topology(topo_m=body(V100), allow_incomplete=True)
    assert not partial.complete and len(partial.gpus) == 16 and len(partial.nics) == 10
    assert partial.gpus[3].cpus == list(range(24)) + list(range(48, 72)) and partial.gpus[4].cpus == []
    assert partial.to_dict()["complete"] is False


def test_one_5090_two_nics_tabs() -> None:
    m = parse_topo_matrix(body(ONE_5090))
    assert m.gpus == ["GPU0"] and m.nics == ["NIC0", "NIC1"]
    assert m.nic_links == [["NODE", "NODE"]]
    assert m.nic_nic_links == [["X", "PIX"], ["PIX", "X"]]
    assert m.cpu_affinity == ["32-63,96-127"] and m.numa_affinity == [1] and m.gpu_numa_id == [None]
    topo = build_topology(topo_m=body(ONE_5090))
    assert topo.gpus[0].cpus == list(range(32, 64)) + list(range(96, 128))
    assert topo.gpus[0].numa_node == 1


def test_mangled_indented_paste_holds_topo_and_p2p() -> None:
    text = body(MANGLED)
    m = parse_topo_matrix(text)
    assert m.links == [["X", "NODE"], ["NODE", "X"]]
    assert m.cpu_affinity == ["0-15", "0-15"] and m.numa_affinity == [0, 0]
    p2p = parse_p2p_matrix(text)
    assert p2p.status == [["X", "NS"], ["NS", "X"]]
    # Given as topo -m alone, the paste's P2P block is used too.
    assert build_topology(topo_m=text).p2p_matrix() == [["X", "NS"], ["NS", "X"]]
    assert build_topology(topo_m=body(FOUR_GPU)).p2p_matrix() is None


@pytest.mark.parametrize(("name", "cpus"), [(TWO_3090, "0-31"), (TWO_5090, "0-63")])
def test_two_gpu_phb_single_node(name: str, cpus: str) -> None:
    m = parse_topo_matrix(body(name))
    assert m.links == [["X", "PHB"], ["PHB", "X"]]
    assert m.cpu_affinity == [cpus, cpus] and m.numa_affinity == [0, 0] and m.gpu_numa_id == [None, None]
    assert m.columns == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]


def test_four_gpu_pxb_pix_sys_without_gpu_numa_id() -> None:
    m = parse_topo_matrix(body(FOUR_GPU))
    assert m.columns == ["CPU Affinity", "NUMA Affinity"]
    assert m.links == [
        ["X", "PXB", "SYS", "SYS"],
        ["PXB", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "PIX"],
        ["SYS", "SYS", "PIX", "X"],
    ]
    assert m.cpu_affinity == ["0-27,56-83"] * 2 + ["28-55,84-111"] * 2
    assert m.numa_affinity == [0, 0, 1, 1]
    assert m.nics == []


def test_l40s_dual_socket_with_nic_legend() -> None:
    m = parse_topo_matrix(body(L40S))
    assert m.links[0][1] == "NODE" and m.links[2][3] == "NODE"
    assert all(m.links[a][b] == "SYS" for a in (0, 1) for b in (2, 3))
    assert m.cpu_affinity == ["0-95,192-287"] * 2 + ["96-191,288-383"] * 2
    assert m.numa_affinity == [0, 0, 1, 1]
    assert m.nic_links == [["SYS", "SYS"], ["SYS", "SYS"], ["NODE", "NODE"], ["NODE", "NODE"]]
    assert m.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    topo = build_topology(topo_m=body(L40S))
    assert topo.nics == ["NIC0", "NIC1"] and topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert len(topo.gpus[3].cpus) == 192


def test_nv18_8gpu_trailing_tabs_truncated_nic_rows() -> None:
    m = parse_topo_matrix(body(NV18_22372))
    assert len(m.gpus) == 8 and m.nics == [f"NIC{i}" for i in range(8)]
    assert all_off_diagonal(m.links, "NV18")
    assert m.numa_affinity == [0] * 4 + [1] * 4
    assert m.cpu_affinity == ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4
    # Only NIC rows are cut: the GPU matrix is whole, so planning goes on with a warning.
    assert m.complete and m.missing_rows == [f"NIC{i}" for i in range(3, 8)]
    topo = build_topology(topo_m=body(NV18_22372))
    assert any("NIC3" in w for w in topo.warnings)


def test_8x4090_dual_socket_all_sys() -> None:
    m = parse_topo_matrix(body(RTX4090_8))
    assert len(m.gpus) == 8 and m.nics == ["NIC0", "NIC1"]
    assert all_off_diagonal(m.links, "SYS")
    assert m.nic_links[6] == ["PHB", "PHB"]
    assert all(m.nic_links[i] == ["SYS", "SYS"] for i in range(8) if i != 6)
    assert m.numa_affinity == [0] * 4 + [1] * 4
    assert m.cpu_affinity == ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4
    assert m.complete and not m.missing_rows


def test_8xh100_nv18_nine_nics_truncated() -> None:
    m = parse_topo_matrix(body(H100_1453))
    assert len(m.gpus) == 8 and len(m.nics) == 9
    assert all_off_diagonal(m.links, "NV18")
    assert m.cpu_affinity == ["0-79"] * 4 + ["80-159"] * 4
    assert m.numa_affinity == [0] * 4 + [1] * 4
    assert all(row[0] == "SYS" for row in m.nic_links)  # NIC0 = management NIC
    assert m.missing_rows == ["NIC6", "NIC7", "NIC8"] and m.complete


@pytest.mark.parametrize("name", TOPO_FILES)
def test_metadata_header_and_pasted_issue_text_are_tolerated(name: str) -> None:
    expected = parse_topo_matrix(body(name))
    assert parse_topo_matrix(raw(TOPO / name)) == expected
    # A cut paste ends at its code fence; prose after a cut would make its last row look whole.
    tail = "" if "TRUNCATED" in name else "Any idea? GPU0 is slow.\n"
    pasted = f"Hi, my box:\n\n```\n$ nvidia-smi topo -m\n{body(name)}```\n{tail}"
    assert parse_topo_matrix(pasted) == expected


def test_glued_cells_like_vllm_13855() -> None:
    """vllm#13855 shows `NIC8NIC9` / `NODENODE` (a lost TAB). Reproduced here on the real 22372 capture."""
    text = body(NV18_22372)
    glued = text.replace("NIC6\tNIC7", "NIC6NIC7", 1)
    gpu4 = next(line for line in glued.splitlines() if line.startswith("GPU4"))
    assert "PIX\tNODE\tNODE" in gpu4
    glued = glued.replace(gpu4, gpu4.replace("PIX\tNODE\tNODE", "PIX\tNODENODE", 1))
    assert parse_topo_matrix(glued).links == parse_topo_matrix(text).links
    assert parse_topo_matrix(glued).nic_links == parse_topo_matrix(text).nic_links


def test_blank_cpu_and_numa_affinity_like_vllm_19607() -> None:
    """INDEX.md: blank CPU/NUMA affinity cells leave only `N/A` (under GPU NUMA ID). Reproduced on 21028."""
    text = body(ONE_5090).replace("\t32-63,96-127\t1\t\tN/A", "\t\t\t\tN/A")
    m = parse_topo_matrix(text)
    assert m.cpu_affinity == [None] and m.numa_affinity == [None] and m.gpu_numa_id == [None]
    topo = build_topology(topo_m=text)
    assert topo.gpus[0].numa_node is None and topo.gpus[0].numa_source.startswith("unknown")


def test_misaligned_matrix_is_refused() -> None:
    text = body(FOUR_GPU).replace("GPU1\tPXB\t X \t", "GPU1\t X \t", 1)
    with pytest.raises(FleetInputError, match=r"GPU1 .*misaligned"):
        parse_topo_matrix(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"no `nvidia-smi topo -m` matrix"),
        ("Architecture: x86_64\nCPU(s): 32\n", r"no `nvidia-smi topo -m` matrix.*Architecture"),
        (raw(H200 / "nvsmi-topo-m-i0.txt"), r"no `nvidia-smi topo -m` matrix.*-i command line"),
        (raw(H200 / "nvsmi-topo-p2p-r.txt"), r"topo -p2p` matrix .*not `nvidia-smi topo -m`"),
    ],
)
def test_topo_m_refuses_text_that_is_not_a_matrix(text: str, match: str) -> None:
    with pytest.raises(FleetInputError, match=match):
        parse_topo_matrix(text)


def test_no_devices_found_means_no_gpus() -> None:
    m = parse_topo_matrix("No devices were found\n")
    assert m.gpus == []
    assert build_topology(topo_m="No devices were found\n").gpus == []


# ------------------------------------------------------------------------------------ topo -p2p


def test_p2p_gns_2x5090() -> None:
    p2p = parse_p2p_matrix(body("p2p-rw-2x5090-gns-tabs-club3090-1229.txt"))
    assert p2p.gpus == ["GPU0", "GPU1"] and p2p.status == [["X", "GNS"], ["GNS", "X"]]
    assert p2p.not_ok([0, 1]) == [(0, 1, "GNS")]


@pytest.mark.parametrize(("name", "kind"), [("r", "read"), ("w", "write"), ("n", "nvlink")])
def test_p2p_h200_ansi_header_ok(name: str, kind: str) -> None:
    p2p = parse_p2p_matrix(raw(H200 / f"nvsmi-topo-p2p-{name}.txt"))
    assert p2p.status == [["X", "OK"], ["OK", "X"]] and p2p.kind == kind
    assert p2p.not_ok([0, 1]) == []


def test_p2p_refuses_topo_m_and_incomplete_matrix() -> None:
    with pytest.raises(FleetInputError, match="no `nvidia-smi topo -p2p` matrix"):
        parse_p2p_matrix(body(FOUR_GPU))
    cut = " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n"
    with pytest.raises(FleetInputError, match="incomplete"):
        parse_p2p_matrix(cut)


# ------------------------------------------------------------------------------------ query-gpu CSV


def test_query_gpu_with_header_and_units() -> None:
    rows = parse_query_gpu_csv(raw(H200 / "nvsmi-query.txt"))
    assert [r.index for r in rows] == [0, 1]
    assert rows[0].name == "NVIDIA H200" and rows[0].memory_total_mib == 143771
    assert rows[0].bus_id == "0000:00:06.0" and rows[1].bus_id == "0000:00:07.0"
    assert rows[0].uuid == "GPU-06c89465-eb2f-3ed6-8814-c4ceb7a110f6"
    assert (rows[0].pcie_gen_max, rows[0].pcie_width_max) == (5, 16)
    assert rows[0].pcie_gen_current is None  # not queried in that capture
    assert rows[0].extra["driver_version"] == "580.159.04"


def test_query_gpu_noheader_nounits_takes_fields_from_the_command_line() -> None:
    rows = parse_query_gpu_csv(raw(H200 / "nvsmi-query-nounits.txt"))
    assert [(r.index, r.memory_total_mib, r.bus_id) for r in rows] == [
        (0, 143771, "0000:00:06.0"),
        (1, 143771, "0000:00:07.0"),
    ]


def test_query_gpu_noheader_with_explicit_fields() -> None:
    lines = [line for line in raw(H200 / "nvsmi-query-nounits.txt").splitlines() if line[:1].isdigit()]
    rows = parse_query_gpu_csv(
        "\n".join(lines), fields=["index", "name", "uuid", "pci.bus_id", "memory.total"]
    )
    assert rows[1].memory_total_mib == 143771
    with pytest.raises(FleetInputError, match=r"5 fields but the field list"):
        parse_query_gpu_csv("\n".join(lines))  # default field list has 9 fields


def test_query_gpu_without_index_field_numbers_rows_in_order() -> None:
    lines = raw(H200 / "nvsmi-query.txt").splitlines()
    no_index = "\n".join(line.split(", ", 1)[1] for line in lines[1:4])  # header + 2 rows minus `index`
    rows = parse_query_gpu_csv("Output below:\n" + no_index + "\nthat's all, folks\n")
    assert [(r.index, r.bus_id) for r in rows] == [(0, "0000:00:06.0"), (1, "0000:00:07.0")]


def test_query_gpu_fresh_capture_has_current_and_max_pcie() -> None:
    rows = parse_query_gpu_csv(raw(RECORDED / "h200x2" / "query-gpu.csv"))
    assert [(r.pcie_gen_current, r.pcie_gen_max, r.pcie_width_current, r.pcie_width_max) for r in rows] == [
        (5, 5, 16, 16)
    ] * 2


def test_query_gpu_refuses_other_text() -> None:
    with pytest.raises(FleetInputError, match="no row matches the 9 fields"):
        parse_query_gpu_csv(raw(H200 / "lscpu.txt"))
    with pytest.raises(FleetInputError, match="no CSV rows"):
        parse_query_gpu_csv(raw(H200 / "numactl-H.txt"))
    assert parse_query_gpu_csv("No devices were found\n") == []


# ------------------------------------------------------------------------------------ numactl, lscpu, sysfs


def test_numactl_threadripper_memoryless_nodes() -> None:
    hw = parse_numactl_hardware(body("numactl-H-threadripper3960x-nps4-memoryless-nodes-numactl-165.txt"))
    assert [n.id for n in hw.nodes] == [0, 1, 2, 3]
    assert [n.memory_mb for n in hw.nodes] == [0, 64307, 64472, 0]
    assert hw.nodes[0].cpus == [0, 1, 2, 3, 4, 5, 24, 25, 26, 27, 28, 29]
    assert hw.distances[0] == {0: 10, 1: 12, 2: 12, 3: 12}


def test_numactl_cpuless_nodes_odd_ids() -> None:
    hw = parse_numactl_hardware(body("numactl-hardware-6nodes-cpuless-gpu-memory-nodes-legion-1338.txt"))
    assert [n.id for n in hw.nodes] == [0, 8, 252, 253, 254, 255]
    assert hw.nodes[0].cpus == list(range(64)) and hw.nodes[1].cpus == list(range(64, 128))
    assert all(n.cpus == [] and n.memory_mb == 16128 for n in hw.nodes[2:])
    assert hw.distances[0][8] == 40 and hw.distances[252][0] == 80 and hw.distances[255][255] == 10


def test_numactl_cpu_compress() -> None:
    hw = parse_numactl_hardware(body("numactl-hardware-cpu-compress-2x-epyc9135-4090-ktransformers-797.txt"))
    assert [(n.id, n.cpus) for n in hw.nodes] == [(0, list(range(16))), (1, list(range(16, 32)))]
    assert hw.distances[0][1] == 32


def test_numactl_h200_capture() -> None:
    hw = parse_numactl_hardware(raw(H200 / "numactl-H.txt"))
    assert [(n.id, len(n.cpus), n.memory_mb) for n in hw.nodes] == [(0, 32, 4699)]


def test_numactl_refuses_truncated_and_foreign_text() -> None:
    text = body("numactl-H-threadripper3960x-nps4-memoryless-nodes-numactl-165.txt")
    cut = text.split("node 2 cpus")[0]
    with pytest.raises(FleetInputError, match=r"nodes \[2, 3\] are declared"):
        parse_numactl_hardware(cut)
    with pytest.raises(FleetInputError, match="numactl --hardware"):
        parse_numactl_hardware(body(FOUR_GPU))


def test_lscpu_gh200_numa_section_empty_lists() -> None:
    info = parse_lscpu(body("lscpu-numa-section-gh200-9nodes-empty-cpulists-xpu-perf-129.txt"))
    assert info.numa_node_count == 9 and sorted(info.numa_nodes) == list(range(9))
    assert info.numa_nodes[0] == list(range(72))
    assert all(info.numa_nodes[i] == [] for i in range(1, 9))
    assert info.complete


def test_lscpu_old_flat_layout_offline_cpus() -> None:
    info = parse_lscpu(body("lscpu-old-format-offline-cpus-irregular-numa-dpvs-612.txt"))
    assert info.cpus == 96 and info.online == list(range(48)) and info.offline == list(range(48, 96))
    assert info.sockets == 2 and info.numa_node_count == 4
    assert info.numa_nodes[0] == [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 19, 20]


def test_lscpu_partial_collect_env_tail() -> None:
    info = parse_lscpu(body("lscpu-tail-8numa-nps4-vllm-16706-PARTIAL.txt"))
    assert info.numa_node_count == 8 and info.complete
    assert info.numa_nodes[0] == list(range(8)) + list(range(64, 72))
    assert info.numa_nodes[7] == list(range(56, 64)) + list(range(120, 128))
    assert info.cpus is None and info.sockets is None  # cut off before those lines


def test_lscpu_partial_announcing_more_nodes_than_listed() -> None:
    text = body("lscpu-tail-8numa-nps4-vllm-16706-PARTIAL.txt").split("NUMA node5")[0]
    info = parse_lscpu(text)
    assert not info.complete
    topo = build_topology(topo_m=body(ONE_5090), lscpu=text)
    assert any("announces 8 NUMA nodes but lists 5" in w for w in topo.warnings)


def test_lscpu_json_and_text_agree_h200() -> None:
    text = parse_lscpu(raw(H200 / "lscpu.txt"))
    js = parse_lscpu(raw(H200 / "lscpu-json.txt"))
    assert text == js
    assert (text.cpus, text.sockets, text.numa_nodes, text.hypervisor) == (32, 1, {0: list(range(32))}, "KVM")


def test_lscpu_refuses_other_text() -> None:
    with pytest.raises(FleetInputError, match="no lscpu fields"):
        parse_lscpu(body(FOUR_GPU))
    with pytest.raises(FleetInputError, match="not valid JSON"):
        parse_lscpu('{"lscpu": [')


def test_sysfs_numa_formats() -> None:
    blocks = parse_sysfs_numa(raw(H200 / "sys-pci-gpus.txt"))
    assert blocks == {"0000:00:06.0": None, "0000:00:07.0": None}
    grep = parse_sysfs_numa(raw(RECORDED / "h200x2" / "sysfs-gpu-numa.txt"))
    assert len(grep) == 8 and grep["0000:00:07.0"] is None
    assert parse_sysfs_numa("0000:3b:00.0 1\n0000:af:00.0: 0\n") == {"0000:3b:00.0": 1, "0000:af:00.0": 0}
    with pytest.raises(FleetInputError, match="no PCI device numa_node"):
        parse_sysfs_numa(raw(H200 / "numactl-H.txt"))


# ------------------------------------------------------------------------------------ helpers


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,6-8,12-14,19,20") == [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 19, 20]
    assert parse_cpu_list("0-15 (16)") == list(range(16))
    assert parse_cpu_list(" 0 1 2 ") == [0, 1, 2]
    assert parse_cpu_list("N/A") == [] and parse_cpu_list("") == []
    assert format_cpu_list([0, 1, 2, 3, 56, 57, 9]) == "0-3,9,56-57"
    for bad in ("0-x", "5-2", "a"):
        with pytest.raises(FleetInputError, match="CPU list"):
            parse_cpu_list(bad)


def test_bus_ids_and_link_kinds() -> None:
    assert normalize_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert normalize_bus_id("0000:AF:00.0") == "0000:af:00.0"
    with pytest.raises(FleetInputError, match="PCI bus id"):
        normalize_bus_id("GPU0")
    assert [link_kind(x) for x in ("X", "NV18", "SYS", "NODE", "PIX", None)] == [
        "self",
        "nvlink",
        "sys",
        "pcie",
        "pcie",
        "unknown",
    ]


# ------------------------------------------------------------------------------------ merged topology


def h200_topology() -> Topology:
    return build_topology(
        topo_m=raw(H200 / "nvsmi-topo-m.txt"),
        p2p=raw(H200 / "nvsmi-topo-p2p-r.txt"),
        p2p_write=raw(H200 / "nvsmi-topo-p2p-w.txt"),
        numactl=raw(H200 / "numactl-H.txt"),
        lscpu=raw(H200 / "lscpu.txt"),
        query_gpu=raw(H200 / "nvsmi-query.txt"),
        sysfs_numa=raw(H200 / "sys-pci-gpus.txt"),
    )


def test_h200_capture_numa_unknown_from_sysfs() -> None:
    topo = h200_topology()
    assert [g.name for g in topo.gpus] == ["NVIDIA H200"] * 2
    assert topo.links == [["X", "NV18"], ["NV18", "X"]]
    assert topo.p2p_matrix() == [["X", "OK"], ["OK", "X"]]
    assert [g.numa_node for g in topo.gpus] == [None, None] and not topo.numa_known
    assert "-1" in topo.gpus[0].numa_source and "NUMA Affinity 0" in topo.gpus[0].numa_source
    assert topo.hypervisor == "KVM" and topo.numa_nodes[0].memory_mb == 4699
    data = topo.to_dict()
    assert data["gpus"][0]["numa_node"] is None and data["p2p"] == [["X", "OK"], ["OK", "X"]]


def test_h200_without_sysfs_trusts_topo_m() -> None:
    topo = build_topology(topo_m=raw(H200 / "nvsmi-topo-m.txt"))
    assert [g.numa_node for g in topo.gpus] == [0, 0]
    assert topo.gpus[0].numa_source == "nvidia-smi topo -m NUMA Affinity"


def test_sysfs_mapping_as_dict() -> None:
    topo = build_topology(
        topo_m=raw(H200 / "nvsmi-topo-m.txt"),
        query_gpu=raw(H200 / "nvsmi-query.txt"),
        sysfs_numa_nodes={"00000000:00:06.0": "-1", "0000:00:07.0": "-1"},
    )
    assert not topo.numa_known
    with pytest.raises(FleetInputError, match=r"sysfs_numa_nodes\['0000:00:06.0'\]"):
        build_topology(topo_m=raw(H200 / "nvsmi-topo-m.txt"), sysfs_numa_nodes={"0000:00:06.0": "x"})


def test_numa_derived_from_cpu_affinity_when_topo_m_has_no_numa_column() -> None:
    """The oldest format (V100 capture) has only CPU Affinity; the rule is checked on the real 4-GPU capture
    with its NUMA column cut away: the node then comes from numactl's CPU lists."""
    four = "\n".join(
        line.rsplit("\t", 1)[0] if line.strip() else line for line in body(FOUR_GPU).splitlines()
    )
    assert "NUMA Affinity" not in four
    numactl = "available: 2 nodes (0-1)\nnode 0 cpus: 0-27,56-83\nnode 1 cpus: 28-55,84-111\n"
    topo = build_topology(topo_m=four, numactl=numactl)
    assert [g.numa_node for g in topo.gpus] == [0, 0, 1, 1]
    assert "lies in NUMA node 0" in topo.gpus[0].numa_source
    assert [g.numa_node for g in build_topology(topo_m=four).gpus] == [None] * 4


def test_inputs_from_different_hosts_are_refused() -> None:
    with pytest.raises(FleetInputError, match="query-gpu lists 2 GPUs but topo -m shows 4"):
        build_topology(topo_m=body(FOUR_GPU), query_gpu=raw(H200 / "nvsmi-query.txt"))
    with pytest.raises(FleetInputError, match="matrix has 2 GPUs but the host has 4"):
        build_topology(topo_m=body(FOUR_GPU), p2p=raw(H200 / "nvsmi-topo-p2p-r.txt"))


def test_topology_round_trips_through_json() -> None:
    topo = h200_topology()
    again = Topology.from_dict(topo.to_dict())
    assert again.to_dict() == topo.to_dict()


# ------------------------------------------------------------------------------------ recorded folders


def test_recorded_file_names_and_commands_agree() -> None:
    assert set(RECORDED_COMMANDS) == set(RECORDED_FILES.values())
    assert "pcie.link.gen.current" in RECORDED_COMMANDS["query-gpu.csv"]


def test_recorded_h200x2_fresh_capture() -> None:
    topo = build_topology_from_dir(RECORDED / "h200x2")
    assert len(topo.gpus) == 2 and topo.links[0][1] == "NV18"
    assert topo.gpus[1].uuid == "GPU-a46bf242-7bb2-ddcc-19bb-049759e02b1c"
    assert [g.pcie_below_max() for g in topo.gpus] == [[], []]
    assert not topo.numa_known and topo.p2p_status(0, 1) == "OK"


def test_recorded_8x4090_folder_with_topo_m_only() -> None:
    topo = build_topology_from_dir(RECORDED / "8x4090-dual-socket")
    assert len(topo.gpus) == 8 and [g.numa_node for g in topo.gpus] == [0] * 4 + [1] * 4
    assert topo.p2p_matrix() is None


def test_recorded_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(FleetInputError, match="does not exist"):
        build_topology_from_dir(tmp_path / "nope")
    with pytest.raises(FleetInputError, match="holds none of"):
        build_topology_from_dir(tmp_path)


def test_pcie_below_max_wording() -> None:
    topo = build_topology_from_dir(RECORDED / "h200x2")
    gpu = topo.gpus[0]
    gpu.pcie_gen_current, gpu.pcie_width_current = (
        1,
        8,
    )  # an idle GPU's downshifted link, as nvidia-smi shows it
    assert gpu.pcie_below_max() == ["gen 1 of 5", "x8 of x16"]


def test_build_from_texts_rejects_unknown_keys() -> None:
    with pytest.raises(FleetInputError, match=r"\['topo'\] are not among"):
        build_topology_from_texts({"topo": raw(H200 / "nvsmi-topo-m.txt")})
    assert len(build_topology_from_texts({"topo_m": raw(H200 / "nvsmi-topo-m.txt")}).gpus) == 2
