"""The streaming parser: one automaton pass per block picks the lines and the handlers that read them."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import ahocorasick_rs

from vllm_fleet.terminal import without_escapes
from vllm_fleet.verify.logcheck.lines import (
    UnreadableNumber,
    _car_reason,
    _float,
    _int,
    _maxlen_values,
    _number,
    _parse_spec,
    _parse_stats,
    _transfer_fields,
    backend_name,
    canonical_backend,
    car_disabled_reason,
    clean_line,
    without_pydantic_input,
)
from vllm_fleet.verify.logcheck.patterns import (
    _AVAILABLE,
    _BACKEND_ENUM,
    _BACKEND_NAME,
    _BACKEND_POTENTIAL,
    _BACKEND_WORDS,
    _BLOCKS,
    _CAR_LAUNCHER,
    _CONCURRENCY,
    _CONTINUATION_START,
    _DEAD_ERRORS,
    _DEATH_NEEDLES,
    _DISABLE_CAR,
    _ENGINE_DEATH,
    _ERROR_TABLE,
    _ERRORS,
    _EXCEPTION_LINE,
    _HTTP_5XX,
    _KV_DTYPE_ARGS,
    _KV_DTYPE_CONFIG,
    _KV_DTYPE_USING,
    _KV_TOKENS,
    _KV_TOKENS_TEXT,
    _LEVEL_PREFIX,
    _MAX_SEQ_LEN,
    _NUMA_ENGINE,
    _NUMA_SKIPPED,
    _NUMA_WORKER,
    _OFFLOAD_PATTERNS,
    _PARALLEL_SIZES,
    _PREFIX_V0,
    _READY,
    _RUNNING_ENGINE_DEATH,
    _SETTING_PATTERNS,
    _STOP_EXCEPTIONS,
    _STOP_SIGNAL,
    _TP,
    _UVICORN_STOP,
    _VERSION_PATTERNS,
    _WORKER_PP_RANK,
    _WORKER_RANK,
    _WORKER_TP_RANK,
    TRACEBACK_MAX_LINES,
)
from vllm_fleet.verify.logcheck.records import (
    ERRORS_PER_KIND,
    HISTORY_LIMIT,
    MAX_LINE_CHARS,
    KvCacheReport,
    LogError,
    LogReport,
    _keep_last,
    _set,
)


class LogParser:
    """One streaming pass over a log: `feed(line)` per line, then `finish()` for the report.

    Each handler below is guarded by literal substrings (`_HANDLERS`), all found in one automaton pass per
    block (`_line_masks`); a line that contains none of them costs no Python code and is never cleaned.
    History lists keep their last HISTORY_LIMIT entries
    and each error kind its first ERRORS_PER_KIND lines (`error_counts` counts them all), so memory stays
    flat whatever the journal's length.
    """

    def __init__(self) -> None:
        self.report = LogReport()
        self.dtype_rank = 0  # engine config (3) > "Using ... to store kv cache" (2) > non-default args (1)
        self.numa_nodes: set[int] = set()
        self.seen_errors: set[tuple[str, str]] = set()
        self.current = KvCacheReport()
        self.joins: list[tuple[LogError, list[str]]] = []  # errors whose message may continue on next lines
        # [first line, lines seen, after readiness?] of the traceback being read
        self.traceback: list[Any] | None = None
        self.start_detail = 0  # indented lines after the start exception that still belong to its message
        self.serving = False  # readiness announced since the last start banner (a journal may hold restarts)
        self.stopping = 0  # 0 running; 1 uvicorn said "Shutting down"; 2 a SIGINT/SIGTERM handler said so
        self.stats_lines: list[str] = []
        self.prefix_line: tuple[str, str] | None = None  # the last line that showed the prefix-cache hit rate

    # --- the loop ------------------------------------------------------------------------------------------
    def feed_block(self, block: str) -> None:
        """Whole lines (a block ending at a line end, or the input's last line).

        One pass of the needle automaton (`_MATCHER`, in Rust) over the block finds the lines that hold a
        needle and which handlers each needs; only those lines are cut out, cleaned and handed over. A line
        that holds no needle is never touched by Python code (unless a traceback or wrapped error is open),
        which is what makes a journal of access logs cheap to read. A stats line that only the stats handler
        reads is kept raw (cleaned in finish(), for the last HISTORY_LIMIT only).
        """
        if not block:
            return
        self.report.lines_read += block.count("\n") + (not block.endswith("\n"))
        block = without_escapes(block)  # per line the same as per block: no escape spans a newline
        pos = 0
        for start, end, mask in zip(*_line_masks(block), strict=True):
            if self._open():
                pos = self._follow_until(block, pos, start)
                following = self._open()
            else:
                following = False
            if mask == _STATS_MASK and not following:
                self._on_stats_raw(block[start:end])
            else:
                line = clean_line(block[start:end])
                if following:
                    self._follow(line)
                if line:
                    for handler in _MASK_HANDLERS[mask]:
                        self._handle(handler, line)
            pos = end + 1
        if self._open():
            self._follow_until(block, pos, len(block))

    def _handle(self, handler: Callable[[LogParser, str], None], line: str) -> None:
        """One handler over one line; a garbled number (`1.2.3 GiB`, 5,000 digits) makes the line say
        nothing to that handler, as a line vLLM never prints should."""
        try:
            handler(self, line)
        except UnreadableNumber:
            return

    def _open(self) -> bool:
        """Whether the next lines belong to something already seen (a traceback, a wrapped error, the
        cause of a start exception), so every line is read, needle or not."""
        return bool(self.joins or self.traceback is not None or self.start_detail)

    def feed(self, raw: str) -> None:
        """One line (with or without its newline; cut at MAX_LINE_CHARS)."""
        self.feed_block(self.whole_line(raw))

    def whole_line(self, raw: str) -> str:
        """The line with its newline, cut at MAX_LINE_CHARS (counted in `lines_cut`)."""
        if len(raw) > MAX_LINE_CHARS and len(raw.rstrip("\n")) > MAX_LINE_CHARS:
            self.report.lines_cut += 1
            return raw[:MAX_LINE_CHARS] + "\n"
        return raw if raw.endswith("\n") else raw + "\n"

    def _follow_until(self, block: str, pos: int, stop: int) -> int:
        """Lines from `pos` up to `stop` for `_follow`, while a traceback or a wrapped error is open."""
        while pos < stop and self._open():
            end = block.find("\n", pos)
            end = len(block) if end == -1 else end
            self._follow(clean_line(block[pos:end]))
            pos = end + 1
        return pos

    def finish(self) -> LogReport:
        for error, parts in self.joins:
            _maxlen_values(error, "".join(parts))
        self.joins = []
        self._finish_stats()
        report = self.report
        self._finish_start()
        for history in (report.spec_decode_history, report.kv_cache_reports, report.numa_bindings):
            del history[:-HISTORY_LIMIT]
        report.numa_nodes = sorted(self.numa_nodes)
        if report.numa_bindings:
            report.evidence["numa_nodes"] = report.numa_bindings[-1]["line"]
        return report

    def _follow(self, line: str) -> None:
        """Continuation lines of a hard-wrapped error, and the exception that ends a traceback."""
        still = []
        for error, parts in self.joins:
            if (
                not line
                or _CONTINUATION_START.match(line)
                or (_KV_TOKENS_TEXT in line and _KV_TOKENS.search(line))
            ):
                _maxlen_values(error, "".join(parts))
                continue
            parts.append(line)
            if len(parts) >= 4:
                _maxlen_values(error, "".join(parts))
            else:
                still.append((error, parts))
        self.joins = still
        if self.start_detail:
            self._start_detail(line)
        if self.traceback is not None:
            self.traceback[1] += 1
            message = _LEVEL_PREFIX.sub("", line, count=1)
            if not message or message[0] in " \t^~" or self.traceback[1] > TRACEBACK_MAX_LINES:
                if self.traceback[1] > TRACEBACK_MAX_LINES:
                    self.traceback = None
                return
            # The first line at the traceback's own indentation ends it: the exception, or something else.
            after_ready = self.traceback[2]
            self.traceback = None
            found = _EXCEPTION_LINE.match(message)
            if not found:
                return
            values = {"exception": found.group("exc"), "message": (found.group("msg") or "").strip()}
            if not after_ready:
                self._start_exception(line, values)
                return
            if self._stop_noise("traceback_after_ready", values["exception"]):
                return
            self._error("traceback_after_ready", line, values)
            death = self.report.engine_death
            if (
                death is not None
                and death.get("root_cause") is None
                and values["exception"] not in _DEAD_ERRORS
            ):
                death["root_cause"] = values

    def _error(self, kind: str, line: str, values: dict[str, Any] | None = None) -> LogError | None:
        """Record one fatal line; None when this kind already holds ERRORS_PER_KIND lines or this line."""
        report = self.report
        count = report.error_counts.get(kind, 0)
        report.error_counts[kind] = count + 1
        if count >= ERRORS_PER_KIND or (kind, line) in self.seen_errors:
            return None
        self.seen_errors.add((kind, line))
        error = LogError(kind=kind, line=line, values=values or {})
        report.errors.append(error)
        return error

    def _finish_start(self) -> None:
        """A start that never became ready, whose known fatal lines (if any) do not name the cause: the
        first start-up traceback's exception is the error (`start_exception`)."""
        report = self.report
        if report.ready:
            report.start_exception = None
        named = {e.kind for e in report.errors} - {"engine_init_failed"}
        if report.start_exception is None or named:
            return
        values = {k: v for k, v in report.start_exception.items() if k != "line"}
        self._error("start_exception", report.start_exception["line"], values)
        report.evidence["start_exception"] = report.start_exception["line"]

    # --- handlers, one per kind of line -------------------------------------------------------------------
    def _on_version(self, line: str) -> None:
        for pattern in _VERSION_PATTERNS:
            match = pattern.search(line)
            if match:
                _set(self.report, "version", match.group("v"), line)
                self.serving = False
                self.stopping = 0
                return

    def _on_kv_report(self, line: str) -> None:
        report = self.report
        # `in` first: _KV_TOKENS starts with an alternation, so `re` tries it at every position of the line.
        tokens = _KV_TOKENS.search(line) if _KV_TOKENS_TEXT in line else None
        blocks = None if tokens or " blocks: " not in line else _BLOCKS.search(line)
        if tokens:
            if self.current.tokens is not None or self.current.gpu_blocks is not None:
                self.current = KvCacheReport()
            current = self.current
            current.tokens, current.device, current.line = (
                _int(tokens.group("tokens")),
                tokens.group("dev"),
                line,
            )
            report.kv_cache_reports.append(current)
            _keep_last(report.kv_cache_reports)
            _set(report, "kv_cache_tokens", current.tokens, line)
            _set(report, "kv_cache_device", current.device, line)
        elif blocks and "KV cache" not in line:
            if self.current.gpu_blocks is not None or self.current.tokens is not None:
                self.current = KvCacheReport()
            current = self.current
            current.gpu_blocks = _int(blocks.group("gpu"))
            current.cpu_blocks = _int(blocks.group("cpu")) if blocks.group("cpu") else None
            current.line = line
            report.kv_cache_reports.append(current)
            _keep_last(report.kv_cache_reports)
            _set(report, "gpu_blocks", current.gpu_blocks, line)
            if current.cpu_blocks is not None:
                _set(report, "cpu_blocks", current.cpu_blocks, line)
        concurrency = _CONCURRENCY.search(line)
        if concurrency:
            if self.current.max_concurrency is not None or not report.kv_cache_reports:
                self.current = KvCacheReport(line=line)
                report.kv_cache_reports.append(self.current)
            self.current.max_concurrency = _float(concurrency.group("x"))
            self.current.concurrency_max_model_len = _int(concurrency.group("len"))
            _set(report, "max_concurrency", self.current.max_concurrency, line)
            _set(report, "concurrency_max_model_len", self.current.concurrency_max_model_len, line)

    def _on_available(self, line: str) -> None:
        for pattern in _AVAILABLE:
            match = pattern.search(line)
            if match:
                _set(self.report, "available_kv_cache_gib", _float(match.group("gib")), line)
                return

    def _on_kv_dtype(self, line: str) -> None:
        for pattern, rank in ((_KV_DTYPE_CONFIG, 3), (_KV_DTYPE_USING, 2), (_KV_DTYPE_ARGS, 1)):
            match = pattern.search(line)
            if match and rank >= self.dtype_rank:
                self.dtype_rank = rank
                _set(self.report, "kv_cache_dtype", match.group("d"), line)
                return

    def _on_max_len(self, line: str) -> None:
        match = _MAX_SEQ_LEN.search(line)
        if match:
            value = _int(match.group("n"))
            _set(self.report, "max_model_len", value, line)

    def _on_parallel(self, line: str) -> None:
        match = _TP.search(line)
        if match:
            _set(self.report, "tensor_parallel_size", _int(match.group("n")), line)
        for name, pattern in _PARALLEL_SIZES:
            match = pattern.search(line)
            if match:
                _set(self.report, name, _int(match.group("n")), line)

    def _on_worker_rank(self, line: str) -> None:
        match = _WORKER_RANK.search(line)
        if match is None:
            return
        rest = line[match.end() :]
        pp, tp = _WORKER_PP_RANK.search(rest), _WORKER_TP_RANK.search(rest)
        self.report.worker_ranks.append(
            {
                "rank": _int(match.group("rank")),
                "world_size": _int(match.group("world")),
                "pp_rank": _int(pp.group("n")) if pp else None,
                "tp_rank": _int(tp.group("n")) if tp else None,
                "line": line,
            }
        )
        _keep_last(self.report.worker_ranks)

    def _on_backend(self, line: str) -> None:
        for pattern in (_BACKEND_POTENTIAL, _BACKEND_ENUM, _BACKEND_NAME, _BACKEND_WORDS):
            match = pattern.search(line)
            if match and (pattern is not _BACKEND_NAME or backend_name(match)):
                _set(self.report, "attention_backend", canonical_backend(match.group("n")), line)
                return

    def _on_all_reduce(self, line: str) -> None:
        report = self.report
        why = car_disabled_reason(line)
        if why is not None:
            _set(report, "custom_all_reduce_disabled", True, line)
            _set(report, "custom_all_reduce_disabled_reason", _car_reason(why), line)
        elif _CAR_LAUNCHER.search(line):
            _set(report, "custom_all_reduce_disabled", True, line)
            _set(report, "custom_all_reduce_disabled_reason", "launcher: " + line.strip(), line)
        else:
            match = _DISABLE_CAR.search(line)
            if match:
                if match.group("v") == "True":
                    _set(report, "custom_all_reduce_disabled", True, line)
                    _set(report, "custom_all_reduce_disabled_reason", "disable_custom_all_reduce=True", line)
                elif report.custom_all_reduce_disabled is None:
                    _set(report, "custom_all_reduce_disabled", False, line)

    def _on_numa(self, line: str) -> None:
        report = self.report
        match = _NUMA_WORKER.search(line)
        if match:
            report.numa_bindings.append(
                {
                    "process": "worker",
                    "local_rank": _int(match.group("rank")),
                    "gpu_index": _int(match.group("gpu")),
                    "nodes": [_int(match.group("node"))],
                    "cpus": match.group("cpus"),
                    "line": line,
                }
            )
            _keep_last(report.numa_bindings)
            self.numa_nodes.add(_int(match.group("node")))
        match = _NUMA_ENGINE.search(line)
        if match:
            nodes = [_int(n) for n in re.findall(r"\d+", match.group("nodes"))]
            report.numa_bindings.append(
                {
                    "process": "EngineCore",
                    "local_rank": _int(match.group("rank")),
                    "gpu_index": None,
                    "nodes": nodes,
                    "cpus": None,
                    "line": line,
                }
            )
            _keep_last(report.numa_bindings)
            self.numa_nodes.update(nodes)
        match = _NUMA_SKIPPED.search(line)
        if match:
            _set(report, "numa_auto_binding_skipped", match.group("why"), line)

    def _on_ready(self, line: str) -> None:
        match = _READY.search(line)
        if match:
            _set(self.report, "ready", True, line)
            self.serving = True
            url = match.group("url") or match.group("u2")
            if url:
                self.report.listen_url = url

    def _on_spec(self, line: str) -> None:
        spec = _parse_spec(line)
        if spec:
            self.report.spec_decode_history.append(spec)
            _keep_last(self.report.spec_decode_history)
            if spec.get("avg_draft_acceptance_rate") is not None:
                _set(self.report, "spec_decode", spec, line)

    def _on_stats(self, line: str) -> None:
        # Kept as text and parsed in finish(): only the last HISTORY_LIMIT are reported, and a serving journal
        # has one every 10 s.
        self.stats_lines.append(line)
        _keep_last(self.stats_lines)
        if "Prefix cache hit rate: " in line:
            self.prefix_line = ("stats", line)

    def _on_stats_raw(self, raw: str) -> None:
        """`_on_stats` of a raw line (cleaned in finish(), only the last HISTORY_LIMIT are)."""
        self.stats_lines.append(raw)
        _keep_last(self.stats_lines)
        if "Prefix cache hit rate: " in raw:
            self.prefix_line = ("stats", raw)

    def _on_prefix_v0(self, line: str) -> None:
        if _PREFIX_V0.search(line):
            self.prefix_line = ("v0", line)

    def _finish_stats(self) -> None:
        report = self.report
        for line in map(clean_line, self.stats_lines[-HISTORY_LIMIT:]):
            stats = _parse_stats(line)
            if stats:
                report.stats_history.append(stats)
                _set(report, "stats", stats, line)
        if self.prefix_line is not None:
            kind, line = self.prefix_line[0], clean_line(self.prefix_line[1])
            if kind == "v0":
                match = _PREFIX_V0.search(line)
                try:
                    value = _float(match.group("gpu")) if match else None
                except UnreadableNumber:
                    value = None
            else:
                value = (_parse_stats(line) or {}).get("prefix_cache_hit_rate_percent")
            if value is not None:
                _set(report, "prefix_cache_hit_rate_percent", value, line)

    def _on_offload(self, line: str) -> None:
        """The KV offload tier in effect: connector and spec created, CPU tensors, periodic transfers."""
        report = self.report
        offload = report.kv_offload
        for key, pattern in _OFFLOAD_PATTERNS:
            match = pattern.search(line)
            if not match:
                continue
            if offload is None:
                offload = report.kv_offload = {"transfer_intervals": 0, "transfer_totals": {}}
            if key == "transfer_metrics":
                fields = _transfer_fields(match.group("v"))
                offload["transfer_metrics"] = fields
                offload["transfer_intervals"] += 1
                totals = offload["transfer_totals"]
                for name, value in fields.items():
                    if isinstance(value, int | float):
                        totals[name] = totals.get(name, 0) + value
            elif key == "cpu_bytes_allocated":
                blocks, page = _int(match.group("blocks")), _int(match.group("page"))
                offload[key] = offload.get(key, 0) + blocks * page
            else:
                offload[key] = _number(match.group("v"))
            report.evidence[f"kv_offload.{key}"] = line

    def _on_fatal(self, line: str) -> None:
        for kind, pattern in _ERRORS:
            if not pattern.search(line):
                continue
            error = self._error(kind, line)
            if error is None:
                return
            if kind == "max_model_len_exceeds_kv_cache":
                self.joins.append((error, [line]))
            elif kind == "unrecognized_arguments":
                found = pattern.search(line)
                error.values = {"arguments": found.group("args").strip()} if found else {}
            return

    def _on_engine_death(self, line: str) -> None:
        """An engine that dies while serving (a death during start-up is one of the fatal kinds above).

        EngineDeadError, `EngineCore encountered a fatal error` and `Engine core proc ... died unexpectedly`
        only exist once the engine runs (vllm/v1/engine/core.py run_busy_loop, core_client.py's monitor), so
        they count with or without a readiness line in the log; a worker that dies counts once ready.
        """
        report = self.report
        if not _ENGINE_DEATH.search(line) or not (self.serving or _RUNNING_ENGINE_DEATH.search(line)):
            return
        if self._stop_noise("engine_dead", "EngineDeadError" if "DeadError" in line else "engine death"):
            return
        self.serving = True  # the traceback that follows is the root cause
        report.engine_dead = True
        if report.engine_death is None:
            report.engine_death = {"line": line, "after_ready": report.ready, "root_cause": None}
            report.evidence["engine_death"] = line
        self._error("engine_dead", line)

    def _on_traceback(self, line: str) -> None:
        """A traceback while serving is an error; one during start-up is kept as the start's root cause
        (the first one: the wrappers that re-raise it come after), reported only if the start never became
        ready (`finish`), since a start may log a traceback it recovers from."""
        if "Traceback (most recent call last)" not in line:
            return
        if self.serving:
            self.traceback = [line, 0, True]
        elif self.report.start_exception is None and " WARNING " not in line:
            # a traceback logged as a WARNING (a kernel probe falling back) is not why a start fails
            self.traceback = [line, 0, False]

    def _start_exception(self, line: str, values: dict[str, Any]) -> None:
        if self.stopping:
            return
        self.report.start_exception = {**values, "line": line}
        # huggingface_hub's validation error names its cause on the next, indented line; pydantic's
        # "1 validation error for VllmConfig" on the next one or two (a field name, then "Value error, ...")
        pydantic = values["exception"] == "ValidationError" and "validation error" in values["message"]
        self.start_detail = 2 if pydantic else 1 if values["message"].endswith(":") else 0

    def _start_detail(self, line: str) -> None:
        detail = _LEVEL_PREFIX.sub("", line, count=1)
        if detail[:1] not in (" ", "\t") or not detail.strip() or "For further information visit" in detail:
            self.start_detail = 0
            return
        self.start_detail -= 1
        exception = self.report.start_exception
        text = without_pydantic_input(detail.strip())
        exception["message"] = f"{exception['message']} {text}"
        if text.startswith("Value error,"):
            self.start_detail = 0

    def _on_stop(self, line: str) -> None:
        """A deliberate stop: vLLM's SIGINT/SIGTERM handlers (0.26: launcher.py "[shutdown] API server:
        shutdown triggered", core.py "[shutdown] EngineCore: trigger received signal=SIGINT"), or uvicorn's
        "Shutting down", which it also prints when vLLM stops it after an engine death (logged first)."""
        match = _STOP_SIGNAL.search(line)
        level = 2 if match else 1 if _UVICORN_STOP.search(line) else 0
        if not level:
            return
        report = self.report
        if report.stop is None or level > self.stopping:
            ignored = report.stop["ignored"] if report.stop else {}
            report.stop = {"line": line, "signal": None, "after_ready": report.ready, "ignored": ignored}
            report.evidence["stop"] = line
        self.stopping = max(self.stopping, level)
        if match and match.group("sig"):
            report.stop["signal"] = match.group("sig")

    def _stop_noise(self, kind: str, exception: str) -> bool:
        """Whether this error line is what a deliberate stop prints (counted in `stop.ignored`, not an error).

        After a signal handler's line, the engine client's EngineDeadError ("AsyncLLM output_handler failed",
        the engine was told to exit) and any traceback are the stop's own; after uvicorn's line alone only
        the asyncio cancellation of its tasks (CancelledError, KeyboardInterrupt) is."""
        if not self.stopping or (self.stopping == 1 and exception not in _STOP_EXCEPTIONS):
            return False
        ignored = self.report.stop["ignored"] if self.report.stop else {}
        ignored[kind] = ignored.get(kind, 0) + 1
        return True

    def _on_http_5xx(self, line: str) -> None:
        match = _HTTP_5XX.search(line)
        if match:
            self._error(
                "http_server_error",
                line,
                {
                    "status": _int(match.group("status")),
                    "method": match.group("method"),
                    "path": match.group("path"),
                },
            )


def _setting_handler(name: str, patterns: tuple[Any, ...]) -> Callable[[LogParser, str], None]:
    """The handler of one setting: `settings[name]` = the first of its patterns that matches the line (each
    setting is its own handler, so the needle automaton picks exactly the settings a line holds)."""

    def on_setting(parser: LogParser, line: str) -> None:
        for pattern in patterns:
            match = pattern.search(line)
            if match:
                parser.report.settings[name] = _number(match.group("v"))
                parser.report.evidence[f"settings.{name}"] = line
                return

    on_setting.__name__ = on_setting.__qualname__ = f"_on_setting_{name}"
    return on_setting


# (literal substrings, handler): a handler runs when the raw line holds one of its substrings. Every regex the
# handler uses needs one of them to match, so the prefilter never hides a line the regex would have found.
_HANDLERS: tuple[tuple[tuple[str, ...], Callable[[LogParser, str], None]], ...] = (
    (("version", "LLM engine (v"), LogParser._on_version),
    (("KV cache size:", " blocks: ", "Maximum concurrency for"), LogParser._on_kv_report),
    (("Available KV cache memory", "kv_cache_size=", "KV Cache", "for KV cache"), LogParser._on_available),
    (("kv_cache_dtype", "to store kv cache"), LogParser._on_kv_dtype),
    (("max_seq_len=", "'max_model_len'", "Using max model len"), LogParser._on_max_len),
    (("parallel_size",), LogParser._on_parallel),
    (("in world size",), LogParser._on_worker_rank),
    *((needles, _setting_handler(name, patterns)) for name, needles, patterns in _SETTING_PATTERNS),
    (("backend",), LogParser._on_backend),
    (
        ("Custom allreduce", "-reduce", "-Reduce", "-REDUCE", "disable_custom_all_reduce"),
        LogParser._on_all_reduce,
    ),
    (
        ("Binding ", "CPU affinity is already", "lacks permission to set NUMA", "numactl --show"),
        LogParser._on_numa,
    ),
    (("Application startup complete", "Starting vLLM", "Uvicorn running on"), LogParser._on_ready),
    (("SpecDecoding metrics:", "Speculative metrics:"), LogParser._on_spec),
    (("Avg prompt throughput",), LogParser._on_stats),
    (("Prefix cache hit rate: GPU:",), LogParser._on_prefix_v0),
    (
        (
            "connector with name:",
            "offloading spec with name:",
            "CPU tensors",
            "pinned tensor",
            "KV Transfer metrics:",
            "cpu_bytes_to_use",
            "kv_connector=",
        ),
        LogParser._on_offload,
    ),
    (tuple(needle for _, needles, _ in _ERROR_TABLE for needle in needles), LogParser._on_fatal),
    (_DEATH_NEEDLES, LogParser._on_engine_death),
    (("Traceback (most recent call last)",), LogParser._on_traceback),
    (
        ("[shutdown] API server: shutdown triggered", "trigger received signal=", "Shutting down"),
        LogParser._on_stop,
    ),
    (('HTTP/1.1" 5',), LogParser._on_http_5xx),
)
# One Aho-Corasick automaton of every needle above (ahocorasick_rs, the Rust `aho-corasick` crate): one pass
# over a block finds every occurrence of every needle, instead of one `str.find` pass per needle or gate.
_NEEDLES = tuple(dict.fromkeys(needle for needles, _ in _HANDLERS for needle in needles))
_NEEDLE_BITS = tuple(
    sum(1 << bit for bit, (needles, _) in enumerate(_HANDLERS) if needle in needles) for needle in _NEEDLES
)
_MATCHER = ahocorasick_rs.AhoCorasick(_NEEDLES, implementation=ahocorasick_rs.Implementation.DFA)


class _MaskHandlers(dict):
    """handler bit mask -> the handlers its bits name, in `_HANDLERS` order."""

    def __missing__(self, mask: int) -> tuple[Callable[[LogParser, str], None], ...]:
        handlers = tuple(handler for bit, (_, handler) in enumerate(_HANDLERS) if mask >> bit & 1)
        self[mask] = handlers
        return handlers


_MASK_HANDLERS = _MaskHandlers()  # at most one entry per distinct mask a line produces (a few dozen)
_STATS_MASK = next(1 << bit for bit, (_, handler) in enumerate(_HANDLERS) if handler is LogParser._on_stats)
BLOCK_CHARS = 1 << 20  # characters read per block (whole lines)


def _line_masks(block: str) -> tuple[list[int], list[int], list[int]]:
    """(starts, ends, handler masks) of the block's lines that hold a needle, in order; a line's mask has the
    bit of every handler one of whose needles the line holds (overlapping matches: every needle is seen)."""
    find, rfind = block.find, block.rfind
    starts: list[int] = []
    ends: list[int] = []
    masks: list[int] = []
    line_end = -1
    for index, start, end in _MATCHER.find_matches_as_indexes(block, overlapping=True):
        # Matches come in the order of their ends and no needle holds a newline: a match that ends past the
        # current line is on a later one.
        if end > line_end:
            line_end = find("\n", end)
            if line_end == -1:
                line_end = len(block)
            starts.append(rfind("\n", 0, start) + 1)
            ends.append(line_end)
            masks.append(_NEEDLE_BITS[index])
        else:
            masks[-1] |= _NEEDLE_BITS[index]
    return starts, ends, masks


def parse_lines(lines: Iterable[str]) -> LogReport:
    """Everything vLLM's output says about an instance, in one pass; the last value wins where one repeats."""
    parser = LogParser()
    batch: list[str] = []
    size = 0
    for raw in lines:
        line = parser.whole_line(raw)
        batch.append(line)
        size += len(line)
        if size >= BLOCK_CHARS:
            parser.feed_block("".join(batch))
            batch, size = [], 0
    parser.feed_block("".join(batch))
    return parser.finish()


def parse_log(text: str) -> LogReport:
    """`parse_lines` over a text (any newline convention)."""
    return parse_stream(io.StringIO(text, newline=None))


def parse_stream(handle: TextIO) -> LogReport:
    """A text stream read block by block (BLOCK_CHARS at a time, cut at a line end): memory stays flat.

    A line over MAX_LINE_CHARS is read up to there and the rest of it dropped as it streams by (`lines_cut`),
    so a 100 MB line costs what a 1 MiB one does. Only the first line of a block can be that long: the others
    lie inside one read of at most MAX_LINE_CHARS.
    """
    parser = LogParser()
    size = min(BLOCK_CHARS, MAX_LINE_CHARS)
    rest = ""
    dropping = False  # inside a line already cut: skipped up to its end
    while chunk := handle.read(size):
        if dropping:
            end = chunk.find("\n")
            if end == -1:
                continue
            chunk, dropping = chunk[end + 1 :], False
        chunk = rest + chunk
        first = chunk.find("\n")
        if first > MAX_LINE_CHARS or (first == -1 and len(chunk) > MAX_LINE_CHARS):
            parser.feed_block(parser.whole_line(chunk[: MAX_LINE_CHARS + 1]))
            if first == -1:
                rest, dropping = "", True
                continue
            chunk = chunk[first + 1 :]
        cut = chunk.rfind("\n") + 1
        parser.feed_block(chunk[:cut])
        rest = chunk[cut:]
    parser.feed_block(rest)
    return parser.finish()


def parse_file(path: str | Path) -> LogReport:
    """`parse_stream` over a file (undecodable bytes replaced)."""
    with open(path, encoding="utf-8", errors="replace", newline=None) as handle:
        return parse_stream(handle)
