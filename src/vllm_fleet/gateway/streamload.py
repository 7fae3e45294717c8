"""A load that lasts until it is told to stop: `--concurrency` streams of completions, one request after
another on each with `--pause` seconds between (a user reading the answer), until the stop file appears; each
stream finishes the request it is in, then the result is written.

    python -m vllm_fleet.gateway.streamload --url http://HOST:PORT --model NAME --stop-file F --out R.json
    (the API key on standard input, never on the command line)

`vllm bench serve` is bounded by a number of requests, not by an event: a rollout that took longer than the
load (a loaded machine) left its last restart without load, and a negative control then measured nothing (CI,
stop 36). This one runs from before the rollout until after it, whatever the rollout takes. The pause keeps
it from taking every core: without one, 8 streams kept the lab's other instance (which takes the short set's
requests while their own server restarts) busy on a 2-core machine, and the restarting instance took 6 min
to start instead of 1 (a lab run, 2026-12-04); and a gateway that answers 503 at once would make a loop spin.

Every request streams (`stream_options.include_usage`) with `ignore_eos`, so a whole answer has exactly
`--max-tokens` tokens. The result has the shape of `vllm bench serve --save-result --save-detailed` (per
request: start, TTFT, output tokens, error), read by vllm_fleet.gateway.underload: start times are
`time.monotonic()`, the clock the controller measures the rollout with. A request is failed when it got no
200, raised (a refused or reset connection), got an error event, or its stream ended without vLLM's
`data: [DONE]`; its output is the usage's `completion_tokens`, so fewer than asked is an answer cut short.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

WORDS = ("the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with", "was", "on", "be")


@dataclass
class Record:
    start: float
    ttft_s: float = 0.0
    output_len: int = 0
    error: str = ""


@dataclass
class Load:
    url: str
    model: str
    key: str
    max_tokens: int
    prompt_words: int
    stop_file: Path
    timeout_s: float
    pause_s: float = 0.0
    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def prompt(stream: int, number: int, words: int) -> str:
    """A prompt of `words` words, different for each request (no two share a cached prefix past a word)."""
    picked = (WORDS[(stream * 7 + number * 13 + i * i) % len(WORDS)] for i in range(words))
    return f"{stream}.{number} " + " ".join(picked)


def body(load: Load, text: str) -> bytes:
    return json.dumps(
        {
            "model": load.model,
            "prompt": text,
            "max_tokens": load.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def read_stream(response: http.client.HTTPResponse, record: Record) -> None:
    """Server-sent events until `data: [DONE]`: the first text's time, and the usage's token count."""
    while line := response.readline():
        data = line.strip().removeprefix(b"data:").strip()
        if not data or not line.startswith(b"data:"):
            continue
        if data == b"[DONE]":
            response.read()  # the end of the chunked body: the connection then takes the next request
            return
        event = json.loads(data)
        if event.get("error"):
            record.error = f"error event: {json.dumps(event['error'])[:200]}"
            return
        if not record.ttft_s and event.get("choices"):  # vllm bench serve's TTFT too: text may be empty
            record.ttft_s = time.monotonic() - record.start
        if event.get("usage"):
            record.output_len = int(event["usage"].get("completion_tokens") or 0)
    record.error = "the stream ended without data: [DONE]"


def one_request(load: Load, connection: http.client.HTTPConnection, text: str) -> Record:
    record = Record(start=time.monotonic())
    path = urlsplit(load.url).path.rstrip("/") + "/v1/completions"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {load.key}"}
    try:
        connection.request("POST", path, body(load, text), headers)
        response = connection.getresponse()
        if response.status != 200:
            record.error = f"HTTP {response.status}: {response.read()[:200].decode(errors='replace')}"
        else:
            read_stream(response, record)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    if record.error:
        connection.close()  # a new connection for the next request, as a client would after an error
    return record


def stream_loop(load: Load, stream: int) -> None:
    where = urlsplit(load.url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port or 80, timeout=load.timeout_s)
    number = 0
    while not load.stop_file.exists():
        record = one_request(load, connection, prompt(stream, number, load.prompt_words))
        with load.lock:
            load.records.append(record)
        number += 1
        time.sleep(load.pause_s)
    connection.close()


def result(load: Load, began: float) -> dict:
    """vllm bench serve's detailed-result keys (vllm_fleet.gateway.underload.bench_requests reads them)."""
    records = sorted(load.records, key=lambda r: r.start)
    return {
        "duration": round(time.monotonic() - began, 3),
        "completed": sum(1 for r in records if not r.error),
        "failed": sum(1 for r in records if r.error),
        "start_times": [r.start for r in records],
        "ttfts": [r.ttft_s for r in records],
        "output_lens": [r.output_len for r in records],
        "errors": [r.error for r in records],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's base URL (the gateway's)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--stop-file", required=True, help="the load stops once this file exists")
    parser.add_argument("--out", required=True, help="where the result (JSON) goes")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=120, help="seconds a request may wait on a read")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds a stream waits after each request")
    args = parser.parse_args(argv)
    load = Load(
        url=args.url,
        model=args.model,
        key=sys.stdin.readline().strip(),
        max_tokens=args.max_tokens,
        prompt_words=args.prompt_words,
        stop_file=Path(args.stop_file),
        timeout_s=args.timeout,
        pause_s=args.pause,
    )
    began = time.monotonic()
    streams = [threading.Thread(target=stream_loop, args=(load, n)) for n in range(args.concurrency)]
    for stream in streams:
        stream.start()
    for stream in streams:
        stream.join()
    Path(args.out).write_text(json.dumps(result(load, began)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
