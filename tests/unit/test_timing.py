from vllm_fleet.timing import StageTime, format_stage_table


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
