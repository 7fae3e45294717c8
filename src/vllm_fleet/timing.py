"""Wall time per stage (per play) of a playbook run, as the table the `vllm_fleet_timing` callback prints."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageTime:
    name: str
    seconds: float


def format_stage_table(stages: list[StageTime]) -> str:
    """One line per stage in run order, then the total; a stage that ran twice (two plays of one name) is
    shown once with its times added, where it first ran."""
    merged: dict[str, float] = {}
    for stage in stages:
        merged[stage.name] = merged.get(stage.name, 0.0) + stage.seconds
    if not merged:
        return "stage timings: no play ran"
    width = max(len(name) for name in [*merged, "total"])
    lines = ["stage timings (wall clock):"]
    lines += [f"  {name:<{width}}  {seconds:8.1f} s" for name, seconds in merged.items()]
    lines.append(f"  {'total':<{width}}  {sum(merged.values()):8.1f} s")
    return "\n".join(lines)
