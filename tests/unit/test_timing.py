from vllm_fleet.timing import (
    NO_ROLE,
    StageTime,
    TaskTime,
    format_stage_table,
    format_task_tables,
    role_seconds,
)


def test_stage_table_merges_plays_of_one_name_and_totals():
    table = format_stage_table(
        [StageTime("Probe", 2.04), StageTime("Install", 61.0), StageTime("Probe", 1.0)]
    )
    assert table.splitlines() == [
        "stage timings (wall clock):",
        "  Probe         3.0 s",
        "  Install      61.0 s",
        "  total        64.0 s",
    ]


def test_stage_table_without_plays_says_so():
    assert format_stage_table([]) == "stage timings: no play ran"


def test_stage_names_shorter_than_total_stay_aligned():
    assert format_stage_table([StageTime("A", 1.1)]).splitlines()[1:] == [
        "  A           1.1 s",
        "  total       1.1 s",
    ]


def test_roles_are_summed_slowest_first_and_the_slowest_tasks_listed():
    tasks = [
        TaskTime("vllm_verify", "vllm_verify : Wait for /health", 4.0),
        TaskTime("", "Gather facts", 1.5),
        TaskTime("vllm_service", "Write the unit", 0.5),
        TaskTime("vllm_verify", "GET /metrics", 1.0),
    ]
    assert role_seconds(tasks) == {"vllm_verify": 5.0, NO_ROLE: 1.5, "vllm_service": 0.5}
    lines = format_task_tables(tasks, slowest=2).splitlines()
    assert lines[:5] == [
        "role timings (wall clock, slowest first):",
        "  vllm_verify (2 tasks)       5.0 s",
        "  (play tasks) (1 task)       1.5 s",
        "  vllm_service (1 task)       0.5 s",
        "  total                       7.0 s",
    ]
    assert lines[5:] == [
        "slowest 2 tasks:",
        "  vllm_verify : Wait for /health       4.0 s",
        "  Gather facts                         1.5 s",
    ]
    assert format_task_tables([]) == "role timings: no task ran"


def test_the_callback_times_handlers_called_as_ansible_calls_them():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "plugins" / "callback" / "vllm_fleet_timing.py"
    spec = importlib.util.spec_from_file_location("vllm_fleet_timing_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Handler:
        _role = None

        def get_name(self) -> str:
            return "Restart prometheus"

    callback = module.CallbackModule()
    callback.v2_playbook_on_handler_task_start(Handler())  # ansible passes the task only
    callback._close_task()
    assert [t.name for t in callback._tasks] == ["Restart prometheus"]
