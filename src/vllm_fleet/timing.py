"""Wall time per stage (play), per role and per task of a playbook run, as the tables the `vllm_fleet_timing`
callback prints at the end of every run (what issue 21's re-run benchmark reads)."""

from __future__ import annotations

from dataclasses import dataclass

NO_ROLE = "(play tasks)"


@dataclass(frozen=True)
class StageTime:
    name: str
    seconds: float


@dataclass(frozen=True)
class TaskTime:
    """One task's wall time across the hosts it ran on (the linear strategy runs a task on every host before
    the next task starts, so the wall time between two task starts is that task's)."""

    role: str
    name: str
    seconds: float


def _merged(pairs: list[tuple[str, float]]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for name, seconds in pairs:
        merged[name] = merged.get(name, 0.0) + seconds
    return merged


def _table(title: str, rows: list[tuple[str, float]], total: bool = True) -> list[str]:
    width = max(len(name) for name, _ in [*rows, ("total", 0.0)])
    lines = [title]
    lines += [f"  {name:<{width}}  {seconds:8.1f} s" for name, seconds in rows]
    if total:
        lines.append(f"  {'total':<{width}}  {sum(seconds for _, seconds in rows):8.1f} s")
    return lines


def format_stage_table(stages: list[StageTime]) -> str:
    """One line per stage in run order, then the total; a stage that ran twice (two plays of one name) is
    shown once with its times added, where it first ran."""
    merged = _merged([(stage.name, stage.seconds) for stage in stages])
    if not merged:
        return "stage timings: no play ran"
    return "\n".join(_table("stage timings (wall clock):", list(merged.items())))


def role_seconds(tasks: list[TaskTime]) -> dict[str, float]:
    """Seconds per role (tasks outside any role under NO_ROLE), slowest first."""
    merged = _merged([(task.role or NO_ROLE, task.seconds) for task in tasks])
    return dict(sorted(merged.items(), key=lambda item: -item[1]))


def _tasks(count: int) -> str:
    return f"{count} task" if count == 1 else f"{count} tasks"


def format_task_tables(tasks: list[TaskTime], slowest: int = 10) -> str:
    """Per role (slowest first, with its task count) and the `slowest` tasks of the run."""
    if not tasks:
        return "role timings: no task ran"
    counts = _merged([(task.role or NO_ROLE, 1.0) for task in tasks])
    per_role = [(f"{role} ({_tasks(int(counts[role]))})", s) for role, s in role_seconds(tasks).items()]
    lines = _table("role timings (wall clock, slowest first):", per_role)
    top = sorted(tasks, key=lambda task: -task.seconds)[:slowest]
    named = [(task.name, task.seconds) for task in top]  # ansible names a role's task "role : task"
    lines += _table(f"slowest {len(top)} tasks:", named, total=False)
    return "\n".join(lines)
