"""A pytest plugin that says which tests are still running when no line was printed for 14 s (issue 20: a run
that prints nothing for minutes looks hung). tests/conftest.py starts it for the suite."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

DEFAULT_EVERY_S = 14  # a line at least every 15 s (issue 32; it polls every second)
EVERY_ENV = "VLLM_FLEET_TEST_HEARTBEAT_S"  # for the plugin's own test


class Heartbeat:
    """Prints the running tests and how long each has run when no line was printed for `every` seconds. It
    runs in the process that prints the results: with -n, pytest-xdist relays each worker's test starts and
    ends to it as these same hooks."""

    def __init__(self, write_line: Callable[[str], None], every: float) -> None:
        self.write_line = write_line
        self.every = every
        self.running: dict[str, float] = {}
        self.last_line = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.running[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.running.pop(nodeid, None)

    def watch_lines(self, writer) -> None:
        """Restart the clock at every end of line `writer` (the reporter's TerminalWriter) writes, not at
        every test's end: a finished test is one more dot on a row that ends only when it is full, and a log
        or CI shows lines, not dots (a 2-minute silence between lines was measured that way)."""
        write = writer.write

        def write_and_note(text: str, **markup) -> None:
            write(text, **markup)
            if "\n" in text:
                self.last_line = time.monotonic()

        writer.write = write_and_note

    def _beat(self) -> None:
        while not self.stopped.wait(1):
            now = time.monotonic()
            running = dict(self.running)
            if running and now - self.last_line >= self.every:
                tests = ", ".join(f"{nodeid} ({now - started:.0f} s)" for nodeid, started in running.items())
                self.write_line(f"... still running: {tests}")
                self.last_line = now


def _line_writer(config: pytest.Config, reporter: pytest.TerminalReporter) -> Callable[[str], None]:
    """With pytest-xdist's workers the tests run elsewhere and the reporter's own output is free. In one
    process pytest captures file descriptor 1 while a test runs, so the line goes to a copy of the terminal's
    descriptor taken now, between tests, on a line of its own."""
    if getattr(config.option, "numprocesses", None):

        def to_reporter(line: str) -> None:
            reporter.write_line(line)
            reporter.flush()

        return to_reporter
    terminal = os.dup(sys.stdout.fileno())
    config.add_cleanup(lambda: os.close(terminal))

    def to_terminal(line: str) -> None:
        os.write(terminal, f"\n{line}\n".encode())  # one write: nothing of pytest's gets in between

    return to_terminal


def start(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):  # a pytest-xdist worker prints nothing itself
        return
    every = float(os.environ.get(EVERY_ENV, DEFAULT_EVERY_S))
    heartbeat = Heartbeat(_line_writer(config, reporter), every)
    heartbeat.watch_lines(reporter._tw)
    config.pluginmanager.register(heartbeat, "vllm-fleet-heartbeat")
    heartbeat.thread.start()
    config.add_cleanup(heartbeat.stopped.set)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config: pytest.Config) -> None:  # as a plugin of its own: `pytest -p heartbeat`
    start(config)
