"""Text made safe to print: what a log, a config or a host sent must not drive the reader's terminal.

A log line or a value read from a host may carry escape sequences (colours, but also OSC window titles and
hyperlinks, DCS device strings, ESC c that resets the terminal) and control characters (a carriage return
that overwrites what was printed before it, a backspace, a bell, 8-bit C1 introducers). `terminal_safe`
removes them all; every human-readable output goes through it (`vllm_fleet.cli.emit`, the CLI's error and
warning lines). `without_escapes` removes the escape sequences alone: logcheck and the topology reader match
text with the colours out, and leave the rest to `terminal_safe` when they print.
"""

from __future__ import annotations

import re

# Each alternative starts with ESC and its body cannot hold another ESC or a newline: one linear scan, and the
# same result line by line as over a block of lines.
_ESCAPES = (
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: colours, cursor moves, erase (ECMA-48 8.3.16)
    r"|\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?"  # OSC, DCS, SOS, PM, APC up to BEL or ST (or the line end)
    r"|\x1b[ -/]*[0-~]?"  # every other escape: nF, Fp, Fe, Fs
)
_ESCAPE = re.compile(_ESCAPES)
# and C0 but tab and newline, DEL, C1 (U+0080-U+009F: 8-bit CSI, OSC, DCS), and the bidirectional overrides
# and isolates, which make text display in another order than the one it is in
_UNSAFE = re.compile(_ESCAPES + r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def without_escapes(text: str) -> str:
    """`text` without its escape sequences (CSI, OSC, DCS, SOS, PM, APC and the rest); other characters
    stay. Costs one substring test when there is no ESC."""
    return _ESCAPE.sub("", text) if "\x1b" in text else text


def terminal_safe(text: str) -> str:
    """`text` without escape sequences and without control characters other than tab and newline: what
    every human-readable output is printed through."""
    return _UNSAFE.sub("", text)
