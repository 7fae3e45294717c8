"""The progress line of the readiness wait (plugins/action/vllm_fleet_wait.py): while a model loads, the play
prints, every `interval` seconds, how long it has waited of the start timeout, the unit's state, what /health
answered and the last line vLLM logged, so a long model load never looks like a hung play."""

from __future__ import annotations

# Every 10 s: a line is due at least every 15 s (issue 32; 30 s in issue 20), and a poll that is under way
# when the interval ends (journal read, /health with its timeout) delays it by a few seconds (a 32 s gap was
# measured with a 30 s interval).
WAIT_PROGRESS_INTERVAL_S = 10
LAST_LINE_CHARS = 200


def last_log_line(journal_cat: str) -> str:
    """The last non-empty line of `journalctl -o cat` output, cut to LAST_LINE_CHARS."""
    lines = [line.strip() for line in journal_cat.splitlines() if line.strip()]
    if not lines:
        return "(nothing logged yet)"
    line = lines[-1]
    return line if len(line) <= LAST_LINE_CHARS else line[: LAST_LINE_CHARS - 3] + "..."


def wait_progress_line(
    host: str,
    unit: str,
    waited_s: float,
    timeout_s: int,
    unit_state: str,
    health: int | None,
    last_line: str,
) -> str:
    """`default-1 vllm-fleet-i0.service: waiting for /health, 62 s of 900 s (unit activating/start, /health
    no answer yet); vLLM's last line: ...`"""
    answer = f"/health {health}" if health else "/health no answer yet"
    return (
        f"{host} {unit}: waiting for the model to load, {waited_s:.0f} s of {timeout_s} s "
        f"({unit_state}, {answer}); vLLM's last line: {last_line}"
    )


def requests_progress_line(
    host: str, instance: str, answered: int, elapsed_s: float, last_status: int
) -> str:
    """`default-1 i0: test requests, 6 answered in 11 s (the last: HTTP 200)`: the test requests after a start
    (warm-ups included) take 10-20 s on a CPU host, so they say where they are too."""
    return (
        f"{host} {instance}: test requests, {answered} answered in {elapsed_s:.0f} s "
        f"(the last: HTTP {last_status})"
    )
