"""Filters for the vllm_verify role: thin adapters over `vllm_fleet.verify.report`."""

from __future__ import annotations

from typing import Any

from vllm_fleet.verify import report


def vllm_verify_probe_prompt(
    prompt: str, completion: dict[str, Any], metrics_text: str, max_model_len: Any, max_tokens: Any
) -> str:
    """The verify prompt repeated to span more than one KV block (see `report.probe_prompt`)."""
    body = completion.get("json") if isinstance(completion, dict) else None
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens = int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0
    length = int(max_model_len) if max_model_len not in (None, "") else None
    return report.probe_prompt(prompt, tokens, report.cache_block_size(metrics_text), length, int(max_tokens))


def vllm_verify_stats(results: list[dict[str, Any]] | None, host: str, report_dir: str) -> dict[str, Any]:
    """This host's verdict for `set_stats` (see `report.verify_stats`)."""
    return report.verify_stats(host, results, report_dir)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_verify_probe_prompt": vllm_verify_probe_prompt, "vllm_verify_stats": vllm_verify_stats}
