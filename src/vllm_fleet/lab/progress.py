"""Progress of the lab's long steps (debootstrap, the wheelhouse download and its check install), as events a
reporter prints: a bar redrawn in place on a terminal, plain lines otherwise (CI logs, Ansible, pipes).

A step reports often (every line of a tool's output); the plain reporter prints at most one line per
`interval` seconds, plus every change of phase, so a log shows a step is alive without drowning in lines.
The tool-output parsers are pure functions over the lines debootstrap and pip really print.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

PLAIN_INTERVAL_S = 10.0
BAR_WIDTH = 24


@dataclass(frozen=True)
class Progress:
    """Where a long step is: `done` of `total` `unit` (total None while unknown), and what it does now."""

    step: str  # "root filesystem", "wheelhouse", "wheelhouse check"
    phase: str  # "retrieving", "unpacking", "downloading", "installing", ...
    done: int = 0
    total: int | None = None
    unit: str = ""  # "packages", "MB", "wheels"
    detail: str = ""  # the item being worked on, e.g. a package or wheel name
    elapsed_s: float = 0.0
    target: str = ""  # the folder the step fills


def format_progress(p: Progress) -> str:
    """One plain line: `lab build: wheelhouse: downloading 612 of ~790 MB (torch-...) 95 s -> DIR`."""
    if p.total:
        amount = f" {p.done} of {p.total} {p.unit}"
    elif p.unit:
        amount = f" {p.done} {p.unit}"
    else:
        amount = ""
    detail = f" ({p.detail})" if p.detail else ""
    target = f" -> {p.target}" if p.target else ""
    return f"lab build: {p.step}: {p.phase}{amount}{detail}, {p.elapsed_s:.0f} s{target}"


def format_bar(p: Progress, width: int = BAR_WIDTH) -> str:
    """One terminal line with a bar when the total is known (a spinner-free text otherwise)."""
    if p.total:
        filled = min(width, round(width * p.done / p.total))
        bar = "#" * filled + "-" * (width - filled)
        head = f"{p.step}: {p.phase} [{bar}] {p.done}/{p.total} {p.unit}"
    else:
        head = f"{p.step}: {p.phase} {p.done} {p.unit}".rstrip()
    return f"{head} {p.elapsed_s:.0f} s {p.detail}".rstrip()


class Reporter:
    """Prints Progress events and plain messages to `stream`: a bar redrawn in place on a TTY, else
    rate-limited plain lines."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        interval_s: float = PLAIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = interval_s
        self.clock = clock
        self._last_at = float("-inf")
        self._last_key: tuple[str, str] | None = None
        self._bar_shown = False

    def message(self, text: str) -> None:
        self._end_bar()
        print(text, file=self.stream, flush=True)

    def progress(self, p: Progress) -> None:
        if self.tty:
            columns = shutil.get_terminal_size((120, 24)).columns  # a redrawn line must not wrap
            line = format_bar(p)[: columns - 1]
            print(f"\r\033[K{line}", end="", file=self.stream, flush=True)
            self._bar_shown = True
            return
        now = self.clock()
        key = (p.step, p.phase)
        if key != self._last_key or now - self._last_at >= self.interval_s:
            self._last_key, self._last_at = key, now
            print(format_progress(p), file=self.stream, flush=True)

    def _end_bar(self) -> None:
        if self._bar_shown:
            print(file=self.stream, flush=True)
            self._bar_shown = False

    def close(self) -> None:
        self._end_bar()


# -- what the tools print ------------------------------------------------------------------------------------

_DEBOOTSTRAP_RE = re.compile(
    r"^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) ([^\s:]+?)(?::\w+)?(?:\.\.\.)?(?: \S+)?$"
)
# debootstrap's phase lines without a package (scripts/debian-common: INSTCORE, UNPACKREQ, CONFREQ, ...)
_DEBOOTSTRAP_STAGE_RE = re.compile(
    r"^I: ((?:Installing core|Unpacking required|Configuring required) packages|"
    r"(?:Unpacking|Configuring) the base system)\.\.\.$"
)


# what debootstrap also "retrieves" and "validates" that is not a package: the suite's index files
_DEBOOTSTRAP_INDEXES = ("InRelease", "Release", "Release.gpg", "Packages")


@dataclass
class DebootstrapTally:
    """Counts debootstrap's per-package lines (functions: `Retrieving %s %s`, `Validating %s %s`,
    `Extracting %s...`; dpkg's `Unpacking x:amd64...`, `Configuring x:amd64...` inside its stages):
    downloads count up (their total is not printed), extraction goes through the packages downloaded or
    found valid in the cache, so its total is known; the named stages (`Unpacking the base system...`)
    count their packages up."""

    phase: str = "resolving"
    fetched: int = 0  # retrieved, or validated from a previous download
    done: int = 0
    package: str = ""

    def feed(self, line: str) -> bool:
        """Take one output line; True when it moved the tally."""
        text = line.strip()
        if stage := _DEBOOTSTRAP_STAGE_RE.match(text):
            self.phase, self.done, self.package = stage.group(1).lower(), 0, ""
            return True
        match = _DEBOOTSTRAP_RE.match(text)
        if not match:
            return False
        verb, self.package = match.group(1), match.group(2)
        if self.package in _DEBOOTSTRAP_INDEXES:
            return False
        if verb == "Retrieving" or (verb == "Validating" and self.phase != "downloading"):
            if verb == "Retrieving":
                self.phase = "downloading"
            elif self.phase != "validating cached":
                self.phase = "validating cached"
            self.fetched += 1
            self.done = self.fetched
        elif verb == "Extracting":
            if self.phase != "extracting":
                self.phase, self.done = "extracting", 0
            self.done += 1
        elif verb in ("Unpacking", "Configuring"):
            self.done += 1  # a package of the current stage
        return True

    def total(self) -> int | None:
        return self.fetched if self.phase == "extracting" else None


_PIP_COLLECT_RE = re.compile(r"^Collecting (\S+)")
_PIP_DOWNLOAD_RE = re.compile(r"^\s*Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)")
_PIP_PROCESS_RE = re.compile(r"^Processing (\S+)")
_SIZE = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass
class PipTally:
    """Counts what pip prints without --quiet: `Collecting x`, `  Downloading x.whl (12.3 MB)` (the sizes
    pip announces as it goes; no total exists before the resolver ends) and `Processing ./x.whl`."""

    collected: int = 0
    announced_bytes: float = 0.0
    processed: int = 0
    item: str = ""
    installing: bool = False  # `Installing collected packages: ...`: the last, silent part of an install

    def feed(self, line: str) -> bool:
        if match := _PIP_COLLECT_RE.match(line):
            self.collected += 1
            self.item = match.group(1)
            return True
        if match := _PIP_DOWNLOAD_RE.match(line):
            self.announced_bytes += float(match.group(2)) * _SIZE[match.group(3)]
            self.item = match.group(1).rsplit("/", 1)[-1]
            return True
        if match := _PIP_PROCESS_RE.match(line):
            self.processed += 1
            self.item = match.group(1).rsplit("/", 1)[-1]
            return True
        if line.startswith("Installing collected packages:"):
            self.installing, self.item = True, ""
            return True
        return False
