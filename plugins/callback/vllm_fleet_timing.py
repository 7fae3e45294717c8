"""Prints how long each play (stage), each role and the slowest tasks took, at the end of the run."""

from __future__ import annotations

import time

from ansible.plugins.callback import CallbackBase

from vllm_fleet.timing import StageTime, TaskTime, format_stage_table, format_task_tables

DOCUMENTATION = r"""
name: vllm_fleet_timing
type: aggregate
short_description: wall time per play, per role and of the slowest tasks
description:
  - At the end of a playbook run, prints one line per play with its wall-clock time and the total, then the
    time per role (with its task count) and the ten slowest tasks.
requirements:
  - enable in ansible.cfg (callbacks_enabled)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_fleet_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._stages: list[StageTime] = []
        self._current: tuple[str, float] | None = None
        self._tasks: list[TaskTime] = []
        self._task: tuple[str, str, float] | None = None

    def _close_current(self) -> None:
        if self._current is not None:
            name, started = self._current
            self._stages.append(StageTime(name, time.monotonic() - started))
            self._current = None

    def _close_task(self) -> None:
        if self._task is not None:
            role, name, started = self._task
            self._tasks.append(TaskTime(role, name, time.monotonic() - started))
            self._task = None

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._close_task()
        role = task._role.get_name(include_role_fqcn=False) if task._role else ""
        self._task = (role, task.get_name().strip(), time.monotonic())

    def v2_playbook_on_handler_task_start(self, task) -> None:
        # ansible calls this one with the task alone (no is_conditional): an alias of the method above made
        # every handler a "Callback dispatch failed" warning and left its time out of the tables
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_play_start(self, play) -> None:
        self._close_task()
        self._close_current()
        self._current = (play.get_name().strip() or "unnamed play", time.monotonic())

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_task()
        self._close_current()
        self._display.display(format_stage_table(self._stages))
        self._display.display(format_task_tables(self._tasks))
