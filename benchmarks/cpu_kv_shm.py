#!/usr/bin/env python3
"""What /dev/shm's huge= option does to a CPU KV tier on a GPU host (not a timed test; root, torch + CUDA).

    sudo python3 benchmarks/cpu_kv_shm.py [--size-gib 8] [--modes never,within_size] [--reps 5]

For each huge= mode, /dev/shm is remounted with it and one region is made the way vLLM >= 0.20 makes its CPU
KV tier (vllm/v1/kv_offload/cpu/shared_offload_region.py + host_register.py): a file in /dev/shm, ftruncate,
mmap MAP_SHARED, pre-faulted with MADV_POPULATE_WRITE, then pinned with cudaHostRegister. Printed per mode:
the share of the region backed by huge pages (ShmemHugePages), the time to fault it in and to pin it (both
are paid at every vLLM start, per GiB of tier), and the best host->device / device->host copy bandwidth of
the whole region. /dev/shm's huge= option is put back as it was.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import subprocess
import sys
import time

import torch

GiB = 2**30
SHM = "/dev/shm"


def shm_huge_option() -> str:
    options = subprocess.run(
        ["findmnt", "-bn", "-o", "OPTIONS", "--mountpoint", SHM], capture_output=True, text=True, check=True
    ).stdout.splitlines()[-1]
    return next((o.split("=", 1)[1] for o in options.split(",") if o.startswith("huge=")), "never")


def remount(huge: str) -> None:
    subprocess.run(["mount", "-o", f"remount,huge={huge}", SHM], check=True)


def shmem_huge_bytes() -> int:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("ShmemHugePages:"):
                return int(line.split()[1]) * 1024
    return 0


def measure(size: int, reps: int) -> dict[str, float]:
    cudart = torch.cuda.cudart()
    path = f"{SHM}/vllm_fleet_bench_{os.getpid()}.mmap"
    huge_before = shmem_huge_bytes()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        started = time.perf_counter()
        region.madvise(getattr(mmap, "MADV_POPULATE_WRITE", 23), 0, size)
        populate_s = time.perf_counter() - started
        huge_share = (shmem_huge_bytes() - huge_before) / size
        host = torch.frombuffer(region, dtype=torch.uint8)
        anchor = ctypes.c_char.from_buffer(region)
        address = ctypes.addressof(anchor)
        started = time.perf_counter()
        status = cudart.cudaHostRegister(address, size, 0)
        register_s = time.perf_counter() - started
        if int(status) != 0:
            raise SystemExit(f"cudaHostRegister failed: {status}")
        device = torch.empty(size, dtype=torch.uint8, device="cuda")
        h2d, d2h = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            started = time.perf_counter()
            device.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            h2d.append(time.perf_counter() - started)
            started = time.perf_counter()
            host.copy_(device, non_blocking=True)
            torch.cuda.synchronize()
            d2h.append(time.perf_counter() - started)
        cudart.cudaHostUnregister(address)
        del device, host, anchor  # the mmap cannot close while a buffer of it is exported
        region.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "huge_share": huge_share,
        "populate_s_per_gib": populate_s / (size / GiB),
        "register_s_per_gib": register_s / (size / GiB),
        "h2d_gb_s": size / min(h2d) / 1e9,
        "d2h_gb_s": size / min(d2h) / 1e9,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=8.0)
    parser.add_argument("--modes", default="never,within_size")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    size = int(args.size_gib * GiB) // mmap.PAGESIZE * mmap.PAGESIZE
    original = shm_huge_option()
    rows = []
    try:
        for mode in args.modes.split(","):
            remount(mode)
            rows.append((mode, measure(size, args.reps)))
    finally:
        remount(original)
    print(
        f"# CPU KV tier region in {SHM}: {args.size_gib:g} GiB, {torch.cuda.get_device_name(0)}, "
        f"torch {torch.__version__}, kernel {os.uname().release}, best of {args.reps} copies"
    )
    header = ("huge=", "THP share", "fault-in s/GiB", "pin s/GiB", "H2D GB/s", "D2H GB/s")
    print(f"{header[0]:<12}" + "".join(f" {h:>14}" for h in header[1:]))
    for mode, r in rows:
        cells = (f"{r['huge_share']:.0%}", f"{r['populate_s_per_gib']:.3f}", f"{r['register_s_per_gib']:.3f}")
        cells += (f"{r['h2d_gb_s']:.1f}", f"{r['d2h_gb_s']:.1f}")
        print(f"{mode:<12}" + "".join(f" {c:>14}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
