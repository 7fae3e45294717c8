"""The x86_64 syscall numbers a unit's SystemCallFilter= lines allow, as systemd expands them.

    python3 scripts/seccomp_probe/allowlist.py            # one number a line
    python3 scripts/seccomp_probe/allowlist.py --bitmap   # the hex bitmap probe.c takes in $SP_ALLOW

Reads the unit's filter from vllm_fleet.deploy.service.SYSCALL_FILTER, expands each @group with this
machine's `systemd-analyze syscall-filter` (systemd 252 here) and numbers the names from the kernel's
asm/unistd_64.h. An allow line adds, a `~` line removes, in order, as systemd applies them.
"""

from __future__ import annotations

import re
import subprocess
import sys

from vllm_fleet.deploy.service import SYSCALL_FILTER

HEADER = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"


def expand(group: str, seen: set[str] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if not group.startswith("@"):
        return {group}
    if group in seen:
        return set()
    seen.add(group)
    text = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager", group], capture_output=True, text=True, check=True
    ).stdout
    names: set[str] = set()
    for line in text.splitlines()[1:]:
        word = line.strip()
        if word and not word.startswith("#"):
            names |= expand(word, seen)
    return names


def bitmap(allowed: list[int]) -> str:
    bits = bytearray(max(allowed) // 8 + 1)
    for number in allowed:
        bits[number // 8] |= 1 << (number % 8)
    return bits.hex()


def allowed_numbers() -> list[int]:
    with open(HEADER) as header:
        numbers = dict(re.findall(r"#define __NR_(\w+)\s+(\d+)", header.read()))
    allowed: set[str] = set()
    for line in SYSCALL_FILTER:
        deny = line.startswith("~")
        names = set().union(*(expand(word) for word in line.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return sorted(int(numbers[n]) for n in allowed if n in numbers)


def main() -> int:
    known = allowed_numbers()
    print(bitmap(known) if "--bitmap" in sys.argv[1:] else "\n".join(str(n) for n in known))
    print(f"{len(known)} syscalls allowed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
