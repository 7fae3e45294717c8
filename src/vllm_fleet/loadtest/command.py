"""The `vllm bench serve` run on the client host: its argv and the shell line that gives it the API key.

The key never appears on a command line (where `ps` and Ansible's own output show it): the shell line reads
it from a file on the host into OPENAI_API_KEY, the variable `vllm bench serve` sends as `Authorization:
Bearer` (`vllm/benchmarks/lib/endpoint_request_func.py`). The file is either the instance's EnvironmentFile
that vllm_service wrote (`VLLM_API_KEY="..."`, mode 0600) or a file holding the key alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_fleet.errors import FleetInputError
from vllm_fleet.loadtest.workload import Workload

RESULT_FILE = "bench.json"
TRACE_FILE = "workload.jsonl"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"
# Seconds `timeout` waits after SIGINT before SIGKILL: vllm bench serve stops its tasks and exits on SIGINT.
KILL_AFTER_S = 30


@dataclass(frozen=True)
class BenchTarget:
    """What the client host runs against: the base URL, the model name the API serves, and the model's
    local path (vllm bench serve tokenizes with it) and vLLM binary on the client."""

    base_url: str
    served_model_name: str
    model_path: str
    vllm_bin: str


def vllm_binary(argv: Sequence[str]) -> str:
    """The `.../bin/vllm` of an instance plan's argv (after any numactl/taskset wrapper)."""
    for word, following in zip(argv, [*argv[1:], ""], strict=True):
        if word.endswith("/bin/vllm") and following == "serve":
            return word
    raise FleetInputError(
        f"the instance plan's argv {list(argv)[:6]!r} has no `<venv>/bin/vllm serve`; "
        "deploy with playbooks/deploy.yml, or set fleet_loadtest_vllm_bin"
    )


def bench_argv(target: BenchTarget, workload: Workload, workdir: str, timeout_s: int) -> list[str]:
    """`timeout ... vllm bench serve ...` for the workload's trace in `workdir`, saving `workdir/bench.json`
    with every request's record (--save-detailed)."""
    if timeout_s < 1:
        raise FleetInputError(
            f"fleet_loadtest_timeout is {timeout_s!r}; give the run's bound in seconds (>= 1)"
        )
    pacing = []
    if workload.max_concurrency is not None:
        pacing += ["--max-concurrency", str(workload.max_concurrency)]
    if workload.request_rate is not None:
        pacing += ["--request-rate", f"{workload.request_rate:g}"]
    return [
        "timeout",
        "--signal=INT",
        f"--kill-after={KILL_AFTER_S}",
        str(timeout_s),
        target.vllm_bin,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        target.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        target.model_path,
        "--served-model-name",
        target.served_model_name,
        "--tokenizer",
        target.model_path,
        "--dataset-name",
        "timed_trace",
        "--dataset-path",
        f"{workdir}/{TRACE_FILE}",
        "--no-self-timed",
        "--num-prompts",
        str(workload.num_requests),
        *pacing,
        "--seed",
        str(workload.seed),
        "--temperature",
        "0",
        "--percentile-metrics",
        PERCENTILE_METRICS,
        "--metric-percentiles",
        METRIC_PERCENTILES,
        "--save-result",
        "--save-detailed",
        "--result-dir",
        workdir,
        "--result-filename",
        RESULT_FILE,
        "--disable-tqdm",
    ]


def key_lines(key_file: str, key_variable: str) -> list[str]:
    """Shell lines that set OPENAI_API_KEY from `key_file` (its `key_variable=` line, or the whole file when
    `key_variable` is empty) and stop with a message when the file or the line is missing."""
    path = shlex.quote(key_file)
    if key_variable:
        name = key_variable
        if not name.replace("_", "").isalnum() or name[0].isdigit():
            raise FleetInputError(
                f"fleet_loadtest_api_key_variable {name!r} is not an environment variable name; "
                "give e.g. VLLM_API_KEY, or '' for a file that holds the key alone"
            )
        # systemd EnvironmentFile: NAME="value" (vllm_service quotes every value) or NAME=value
        read = f"sed -n '/^{name}=/{{s/^{name}=//;s/^\"\\(.*\\)\"$/\\1/;p}}' {path} | tail -n 1"
        missing = f"no {name}= line in {key_file}"
    else:
        read = f"cat {path}"
        missing = f"{key_file} is empty"
    return [
        f"[ -r {path} ] || {{ echo {shlex.quote(f'cannot read the API key file {key_file}')} >&2; exit 2; }}",
        f'OPENAI_API_KEY="$({read})"',
        f'[ -n "$OPENAI_API_KEY" ] || {{ echo {shlex.quote(missing)} >&2; exit 2; }}',
        "export OPENAI_API_KEY",
    ]


def bench_script(argv: Sequence[str], seed: int, key_file: str = "", key_variable: str = "") -> str:
    """The shell script the role runs: the key (when a file is named) into the environment, a fixed
    PYTHONHASHSEED (vLLM seeds the trace's chunks with `hash()`), then exec the bench."""
    lines = ["set -eu"]
    if key_file:
        lines += key_lines(key_file, key_variable)
    lines.append(f"export PYTHONHASHSEED={int(seed) % (2**32)}")
    lines.append("exec " + shlex.join(argv))
    return "\n".join(lines) + "\n"
