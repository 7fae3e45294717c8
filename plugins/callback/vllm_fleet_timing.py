"""Prints how long each play (stage) of the run took, at the end of the run."""

from __future__ import annotations

import time

from ansible.plugins.callback import CallbackBase

from vllm_fleet.timing import StageTime, format_stage_table

DOCUMENTATION = r"""
name: vllm_fleet_timing
type: aggregate
short_description: wall time per play (probe, preflight, install, tune, deploy, verify)
description:
  - At the end of a playbook run, prints one line per play with its wall-clock time, and the total.
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

    def _close_current(self) -> None:
        if self._current is not None:
            name, started = self._current
            self._stages.append(StageTime(name, time.monotonic() - started))
            self._current = None

    def v2_playbook_on_play_start(self, play) -> None:
        self._close_current()
        self._current = (play.get_name().strip() or "unnamed play", time.monotonic())

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_current()
        self._display.display(format_stage_table(self._stages))
