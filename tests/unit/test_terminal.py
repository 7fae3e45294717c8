"""`terminal_safe` / `without_escapes`: nothing a log or a host sent drives the reader's terminal (issue 31).

The sequences are the ones xterm documents (ctlseqs: CSI, OSC 0/2 title, OSC 8 hyperlink, OSC 52 clipboard,
DCS, SOS/PM/APC, ESC c reset) and the C0/C1 controls of ECMA-48; the log line around them is a real vLLM 0.32
line from tests/fixtures/metrics/healthy/journal.txt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.terminal import terminal_safe, without_escapes
from vllm_fleet.verify.logcheck import parse_log

CLI = Path(sys.executable).with_name("vllm-fleet")
LINE = "INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0"

HOSTILE = {
    "csi colour": "\x1b[1;31m",
    "csi cursor up and erase": "\x1b[2A\x1b[2K",
    "csi private mode": "\x1b[?1049h",
    "osc title, bel": "\x1b]0;pwned\x07",
    "osc title, st": "\x1b]2;pwned\x1b\\",
    "osc 8 hyperlink": "\x1b]8;;https://attacker.example/\x1b\\",
    "osc 52 clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "osc unterminated": "\x1b]0;no end",
    "dcs": "\x1bP1$tx\x1b\\",
    "sos pm apc": "\x1bXa\x1b\\\x1b^b\x1b\\\x1b_c\x1b\\",
    "reset": "\x1bc",
    "charset": "\x1b(0",
    "8-bit csi osc dcs": "\x9b31m\x9d\x90",
    "carriage return": "\r",
    "backspace bell nul del": "\x08\x07\x00\x7f",
    "bidi override": "\u202e\u2066",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_sequence_and_control_is_removed(name: str) -> None:
    text = terminal_safe(LINE + HOSTILE[name] + " done\tok\n")
    assert "\x1b" not in text and "\x9b" not in text and "\r" not in text
    assert all(c in "\t\n" or (c.isprintable() and c not in "\u202e\u2066") for c in text), repr(text)
    # an OSC that never ends takes the rest of its line, as the terminal would have
    assert text.startswith(LINE) and text.endswith("\n" if name == "osc unterminated" else " done\tok\n")


def test_text_stays_as_it_is() -> None:
    text = "\u2584\u2584 vLLM 0.32 \u00e9t\u00e9 \u4e2d\u6587 tab\there\nnext line\n"
    assert terminal_safe(text) == text == without_escapes(text)


def test_without_escapes_keeps_other_characters_and_works_line_by_line() -> None:
    lines = [LINE + seq + " end\r" for seq in HOSTILE.values()]
    assert without_escapes("\n".join(lines)) == "\n".join(without_escapes(line) for line in lines)
    assert without_escapes("a\x1b]0;t\x07b\rc") == "ab\rc"


@pytest.mark.parametrize(
    "text", ["\x1b]" * 100_000, "\x1b[" + "1;" * 100_000, "\x1b" * 100_000, "\x9b" * 100_000]
)
def test_runs_of_introducers_cost_one_scan(text: str) -> None:
    started = time.monotonic()
    assert "\x1b" not in terminal_safe(text + "x")
    assert time.monotonic() - started < 2


def test_logcheck_reads_and_prints_a_log_without_its_escapes(tmp_path: Path) -> None:
    """The human report once copied OSC and DCS into the terminal (only CSI was stripped); the JSON one
    escapes what it holds, and the parser reads the line with the sequences out."""
    log = tmp_path / "vllm.log"
    log.write_text(
        "\x1b]0;pwned\x07" + LINE + "\x1bP1$tx\x1b\\\n"
        "INFO \x1b[32mApplication startup complete.\x1b[0m\r\n"
        "ERROR \x1b]8;;https://attacker.example/\x1b\\CUDA out of memory\x1b]8;;\x1b\\\x08\x07\n",
        encoding="utf-8",
    )
    assert parse_log(log.read_text()).version == "0.32.0"
    human = subprocess.run([str(CLI), "logcheck", str(log)], capture_output=True, text=True, timeout=60)
    assert "0.32.0" in human.stdout and "cuda_oom" in human.stdout
    for unsafe in ("\x1b", "\x07", "\x08", "\r", "pwned", "attacker"):
        assert unsafe not in human.stdout, unsafe
    data = json.loads(
        subprocess.run(
            [str(CLI), "logcheck", str(log), "--json"], capture_output=True, text=True, timeout=60
        ).stdout
    )
    assert data["version"] == "0.32.0" and data["ready"] is True


def test_an_error_message_is_printed_without_escapes(tmp_path: Path) -> None:
    """A FleetInputError quotes what it was given (a file name here); the terminal must not act on it."""
    name = tmp_path / "x\x1b]0;pwned\x07.json"
    done = subprocess.run(
        [str(CLI), "plan", "--model-config", str(name), "-tp", "1", "--kv-cache-memory-bytes", "1G",
         "--max-model-len", "256"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "cannot read" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
