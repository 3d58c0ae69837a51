"""The engine keeps imported profiles per rank and step: each rank's latest trace, what its window achieved against
its device's peak, the spread between ranks, the profile metrics, and a profile imported after the run ended."""

from __future__ import annotations

import pytest
from test_engine import Run, feed

from trainmeter_core.model import records


def trace(rank, window_s, split, flop=None, trace_id=None, host="n1"):
    return records.ProfileImport(
        importer="kineto", file=f"rank{rank}.json", profiler="torch.profiler", scope="trace",
        trace_id=trace_id or f"t{rank}", host=host, rank=rank, window_s=window_s, split_s=split,
        flop=flop, absent={} if flop is not None else {"flop": "no op in the trace carries FLOPs"},
    )  # fmt: skip


def step(rank, number, run_step, trace_id=None):
    return records.ProfileImport(
        importer="kineto", file=f"rank{rank}.json", profiler="torch.profiler", scope="step",
        trace_id=trace_id or f"t{rank}", host="n1", rank=rank, profiler_step=number, step=run_step, window_s=0.1,
    )  # fmt: skip


def two_ranks() -> Run:
    """Two H100 SXM (989.4 TFLOP/s dense each), one per rank; each rank's trace covers 0.2 s with 49.47 TFLOP."""
    run = Run()
    for r in (0, 1):
        run.gpu(r, f"GPU-{r}")
        run.device(r, index=r, uuid=f"GPU-{r}")
    run.add(step(0, 3, 10))
    run.add(step(0, 4, 11))
    # rank 0: 40 % GEMM, 10 % exposed communication, 50 % idle; rank 1: 70 % GEMM, 30 % idle (it waits least).
    run.add(trace(0, 0.2, {"gemm": 0.08, "communication": 0.02, "idle": 0.1}, flop=49.47e12))
    run.add(trace(1, 0.2, {"gemm": 0.14, "communication": 0.0, "idle": 0.06}, flop=49.47e12))
    return run


def test_each_ranks_profile_achieves_its_flops_over_its_window_against_its_devices_peak():
    run = two_ranks()
    run.tick(120.0, 1)
    _, snapshots = feed(run.records)
    view = snapshots[-1].profile
    assert [t.rank for t in view.traces] == [0, 1]
    # 49.47 TFLOP / 0.2 s = 247.35 TFLOP/s a rank; / 989.4 TFLOP/s = 0.25.
    assert [a.flop_per_s for a in view.achieved] == pytest.approx([247.35e12, 247.35e12])
    assert [a.mfu for a in view.achieved] == pytest.approx([0.25, 0.25])
    metrics = snapshots[-1].metrics
    assert (
        metrics["profile_mfu"].value == pytest.approx(0.25)
        and metrics["profile_mfu"].label == "profiled window"
    )
    assert metrics["profile_flop_per_s"].value == pytest.approx(494.7e12)
    # idle: (0.5 + 0.3) / 2 = 0.4; exposed communication: (0.1 + 0) / 2 = 0.05
    assert metrics["profile_idle"].value == pytest.approx(0.4)
    assert metrics["profile_exposed_communication"].value == pytest.approx(0.05)
    assert [s.step for s in view.steps] == [10, 11]


def test_the_spread_between_ranks_names_the_rank_the_others_wait_for():
    run = two_ranks()
    run.tick(120.0, 1)
    view = feed(run.records)[1][-1].profile
    # GEMM 0.4 against 0.7: spread 0.3; idle 0.5 against 0.3: 0.2; communication 0.1 against 0: 0.1.
    assert view.spread == pytest.approx({"gemm": 0.3, "communication": 0.1, "idle": 0.2})
    assert view.straggler.startswith(
        "rank 1 waits least in communication (0% of its window against up to 10%"
    )


def test_a_profile_without_flops_has_no_mfu_and_says_why():
    run = Run()
    run.add(trace(0, 0.2, {"gemm": 0.1, "idle": 0.1}))
    run.tick(120.0, 1)
    metrics = feed(run.records)[1][-1].metrics
    assert (
        metrics["profile_mfu"].value is None
        and "no op in the trace carries FLOPs" in metrics["profile_mfu"].absent
    )


def test_no_profile_means_no_profile_part_and_no_profile_metric():
    run = Run()
    run.tick(120.0, 1)
    snapshot = feed(run.records)[1][-1]
    assert snapshot.profile is None and not [k for k in snapshot.metrics if k.startswith("profile")]


def test_a_trace_imported_again_replaces_the_first_one_steps_included():
    run = Run()
    for _ in range(2):
        run.add(step(0, 3, 10))
        run.add(trace(0, 0.2, {"gemm": 0.1, "idle": 0.1}))
    run.tick(120.0, 1)
    view = feed(run.records)[1][-1].profile
    assert view.imported == 1 and len(view.steps) == 1


def test_a_profile_imported_after_the_run_ended_gives_a_new_final_snapshot():
    run = Run()
    run.end(130.0)
    run.add(step(0, 3, 10))
    run.add(trace(0, 0.2, {"gemm": 0.1, "idle": 0.1}))
    _, snapshots = feed(run.records)
    assert [s.final for s in snapshots] == [True, True]
    assert snapshots[0].profile is None and snapshots[1].profile.traces[0].rank == 0


def test_the_engine_state_with_profiles_survives_a_checkpoint():
    from trainmeter_core.model.engine import Engine

    run = two_ranks()
    engine, _ = feed(run.records)
    restored = Engine.from_state(engine.state_bytes())
    assert restored.snapshot().profile == engine.snapshot().profile
