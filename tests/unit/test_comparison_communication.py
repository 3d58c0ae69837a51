"""``tm compare`` of runs with a collective probe (``trainmeter_core.model.comparison``): the exposed collective wait,
the wait the straggler causes and the bus bandwidth per operation kind as headline rows, and which rank each run's
straggler was; runs without a probe get no such row."""

from __future__ import annotations

from trainmeter_core.commands.compare import text_lines
from trainmeter_core.model import records
from trainmeter_core.model.comparison import RunSide, compare

NO_PROBE = "no collective probe reported: no rank sent a collectives metric record"


def run(name: str, **metrics: records.MetricValue) -> RunSide:
    snapshot = records.Snapshot(
        tick=5, final=True, state="finished", steps=100, elapsed_s=30.0, metrics=metrics
    )
    return RunSide(name, {"command": ["torchrun", "train.py"]}, snapshot)


def test_communication_rows_and_the_straggler_of_each_run():
    slow = run(
        "a",
        collective_wait_s=records.MetricValue(value=0.2, unit="s"),
        straggler_wait_s=records.MetricValue(value=0.19, unit="s", label="data wait"),
        straggler_rank=records.MetricValue(value=3.0, label="n2"),
        **{
            "bus_bandwidth_bps.all_reduce.4.rank0": records.MetricValue(value=1e9, unit="B/s"),
            "bus_bandwidth_bps.all_reduce.4.rank1": records.MetricValue(value=3e9, unit="B/s"),
            "bus_bandwidth_bps.all_reduce.4.rank2": records.MetricValue(value=2e9, unit="B/s"),
        },
    )
    fixed = run(
        "b",
        collective_wait_s=records.MetricValue(value=0.05, unit="s"),
        straggler_wait_s=records.MetricValue(value=0.004, unit="s"),
        straggler_rank=records.MetricValue(absent="no straggler: the others wait 4.0 ms per step for rank 1"),
        **{"bus_bandwidth_bps.all_reduce.4.rank0": records.MetricValue(value=4e9, unit="B/s")},
    )
    comparison = compare([slow, fixed])
    rows = {row["key"]: row for row in comparison["headline"]}
    assert rows["collective_wait_s"]["values"] == [0.2, 0.05]
    assert rows["collective_wait_s"]["difference"][1] == -0.15000000000000002  # 0.05 − 0.2
    assert rows["straggler_wait_s"]["values"] == [0.19, 0.004]
    # the median of its ranks' bus bandwidths: 1, 2, 3 GB/s -> 2 GB/s; b's one rank 4 GB/s, ×2
    bandwidth = rows["bus_bandwidth_bps.all_reduce.4"]
    assert bandwidth["title"] == "bus bandwidth all_reduce ×4 (median rank)"
    assert bandwidth["values"] == [2e9, 4e9] and bandwidth["ratio"][1] == 2.0
    assert (
        "the straggler: A rank 3 on n2 (data wait); B none: no straggler: the others wait 4.0 ms per step for rank 1"
        in comparison["notes"]
    )
    text = "\n".join(text_lines(comparison))
    (line,) = [line for line in text.splitlines() if "bus bandwidth all_reduce ×4 (median rank)" in line]
    assert line.split()[-4:] == ["B/s", "+2G", "B/s", "×2"] and "2G B/s  4G B/s" in line


def test_runs_without_a_collective_probe_have_no_communication_row_nor_note():
    comparison = compare([run("a", straggler_rank=records.MetricValue(absent=NO_PROBE)), run("b")])
    keys = [row["key"] for row in comparison["headline"]]
    assert not any(k.startswith(("collective_wait", "straggler", "bus_bandwidth")) for k in keys)
    assert not any(note.startswith("the straggler") for note in comparison["notes"])
