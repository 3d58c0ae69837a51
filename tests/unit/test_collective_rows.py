"""The collective probe's per-step figures from flight-recorder entries (``trainmeter_agent/_collective_rows.py``):
which step an entry belongs to, its bytes as nccl-tests counts them, the arrival, what waits for the next read."""

from __future__ import annotations

import pytest

from trainmeter_agent._collective_rows import collective_bytes, step_rows

OFFSET_S = 1_000_000.0  # the wall clock's lead over the monotonic one


def entry(
    record_id: int, seq: int, op: str, created_t: float, numel: int, dtype="Float", group="0", out=None
):
    """A recorder entry created at monotonic time ``created_t``."""
    return {
        "record_id": record_id,
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "process_group": (group, "default_pg"),
        "time_created_ns": int((created_t + OFFSET_S) * 1e9),
        "input_sizes": [[numel]],
        "input_dtypes": [dtype],
        "output_sizes": [[out if out is not None else numel]],
        "output_dtypes": [dtype],
    }


def test_an_all_gather_counts_its_output_and_an_unknown_dtype_has_no_bytes():
    assert collective_bytes(entry(0, 1, "all_gather", 0.0, 100, out=400)) == 1600  # 400 floats × 4 bytes
    assert collective_bytes(entry(0, 1, "all_reduce", 0.0, 100, dtype="Float4_e2m1fn_x2")) is None


def test_entries_go_to_the_step_that_ended_after_them_with_arrival_from_the_previous_step_end():
    boundaries = [(1, 10.0), (2, 11.0)]  # step 2 ran from 10.0 to 11.0
    entries = [
        entry(0, 1, "broadcast", 9.5, 10, dtype="Long"),  # step 1: 80 bytes
        entry(1, 2, "all_reduce", 10.25, 2344),  # step 2: 9376 bytes, 0.25 s after its start
        entry(2, 3, "all_reduce", 10.5, 2344),
        entry(3, 4, "all_reduce", 11.25, 2344),  # step 3, not over: waits for the next read
    ]
    rows, used = step_rows(entries, boundaries, OFFSET_S)
    assert used == 2
    (t1, step1, group1, first), (t2, step2, group2, second) = rows
    assert (t1, step1, group1) == (10.0, 1, "0") and (t2, step2, group2) == (11.0, 2, "0")
    assert first == {
        "collective_count": 1.0,
        "collective_bytes": 80.0,
        "collective_seq_first": 1.0,
        "collective_seq_last": 1.0,
        "collective_broadcast_count": 1.0,
        "collective_broadcast_bytes": 80.0,
    }  # no arrival: the first step has no start
    assert second["collective_count"] == 2.0 and second["collective_all_reduce_bytes"] == 2 * 9376.0
    assert (second["collective_seq_first"], second["collective_seq_last"]) == (2.0, 3.0)
    assert abs(second["collective_arrival_s"] - 0.25) < 1e-6


def test_two_groups_give_two_rows_of_one_step():
    entries = [entry(0, 7, "all_reduce", 10.5, 8), entry(1, 1, "all_reduce", 10.6, 8, group="1")]
    rows, _ = step_rows(entries, [(1, 10.0), (2, 11.0)], OFFSET_S)
    assert [(step, group, values["collective_bytes"]) for _, step, group, values in rows] == [
        (2, "0", 32.0),
        (2, "1", 32.0),
    ]


def test_the_exposed_wait_is_the_last_collective_backwards_end_less_its_last_launch():
    boundaries = [(1, 10.0), (2, 11.0)]
    entries = [entry(0, 1, "all_reduce", 10.3, 8), entry(1, 2, "all_reduce", 10.5, 8)]
    # Step 2: a backward from 10.2 to 10.8 launched both buckets, the last at 10.5: 0.3 s waited after it. A later
    # backward (accumulating under no_sync) launched nothing and is not the one.
    backwards = [(9.2, 9.8), (10.2, 10.8), (10.85, 10.9)]
    rows, _ = step_rows(entries, boundaries, OFFSET_S, backwards)
    ((_, step, _, values),) = rows
    assert step == 2 and abs(values["collective_exposed_s"] - 0.3) < 1e-6


def test_a_step_whose_collectives_were_outside_backward_has_no_exposed_wait():
    rows, _ = step_rows(
        [entry(0, 1, "all_reduce", 10.1, 8)], [(1, 10.0), (2, 11.0)], OFFSET_S, [(10.2, 10.8)]
    )
    assert "collective_exposed_s" not in rows[0][3]


def test_pythons_waits_outside_backward_add_to_the_exposed_wait_of_the_step_they_ended_in():
    boundaries = [(1, 10.0), (2, 11.0)]
    # Step 2: the reducer's all_reduce in backward (0.25 s after it, exposed), then the loss's synchronous all_reduce
    # at 10.9, whose Python wait lasted 0.05 s: 0.3 s in all. A wait that ended in step 1 is step 1's.
    entries = [entry(0, 1, "all_reduce", 10.5, 8), entry(1, 2, "all_reduce", 10.9, 1)]
    waits = [(9.5, 9.6), (10.9, 10.95)]
    rows, _ = step_rows(entries, boundaries, OFFSET_S, [(10.2, 10.75)], waits)
    ((_, step, _, values),) = rows
    assert step == 2 and abs(values["collective_exposed_s"] - (0.25 + 0.05)) < 1e-6


def test_a_steps_summary_adds_its_groups_exposed_waits_and_names_each_op_by_its_group_size():
    from trainmeter_agent._collective_rows import step_summaries

    rows = [
        (10.0, 7, "0", {"collective_exposed_s": 0.25, "collective_all_reduce_count": 2.0,
                        "collective_all_reduce_bytes": 800.0, "collective_count": 2.0, "collective_bytes": 800.0}),
        (10.0, 7, "1", {"collective_all_gather_count": 1.0, "collective_all_gather_bytes": 64.0,
                        "collective_seq_first": 3.0, "collective_seq_last": 3.0}),
        (11.0, 8, "0", {"collective_all_reduce_count": 1.0}),
        (11.0, 8, "9", {"collective_exposed_s": 0.5, "collective_barrier_count": 1.0}),
    ]  # fmt: skip
    summaries = step_summaries(rows, {"0": 4, "1": 2})
    assert summaries == [
        (10.0, 7, {"collective_wait_s": 0.25, "coll.all_reduce.4.count": 2.0, "coll.all_reduce.4.bytes": 800.0,
                   "coll.all_gather.2.count": 1.0, "coll.all_gather.2.bytes": 32.0}),  # its input: 64 / 2
        # group 9's size is not known: its wait counts, its operation is named by no size
        (11.0, 8, {"coll.all_reduce.4.count": 1.0, "collective_wait_s": 0.5}),
    ]  # fmt: skip


def test_a_collective_a_python_wait_saw_through_is_timed_from_its_launch_to_the_waits_end():
    from trainmeter_agent._collective_rows import wait_durations

    entries = [entry(i, i + 1, "all_reduce", t, 256) for i, t in enumerate((1.0, 2.0, 3.0))]
    # entry 0 waited at once; entry 1 never waited from Python (DDP's reducer waits in C++); entry 2 waited later
    waits = [(1.001, 1.25), (3.5, 3.75)]
    assert wait_durations(entries, waits, OFFSET_S) == {0: pytest.approx(0.25), 2: pytest.approx(0.75)}


def test_a_steps_time_per_op_is_kept_only_where_every_one_of_its_collectives_was_timed():
    from trainmeter_agent._collective_rows import step_rows, step_summaries

    entries = [entry(i, i + 1, "all_reduce", t, 256) for i, t in enumerate((1.0, 1.5, 3.0, 3.5))]
    boundaries = [(1, 2.0), (2, 4.0)]
    # step 1: both all_reduces waited from Python; step 2: only the first of its two
    waits = [(1.0, 1.2), (1.5, 1.6), (3.0, 3.4)]
    rows, _ = step_rows(entries, boundaries, OFFSET_S, (), waits)
    by_step = {step: values for _, step, _, values in rows}
    assert by_step[1]["collective_all_reduce_time_s"] == pytest.approx(0.3)
    assert (
        "collective_all_reduce_time_s" not in by_step[2] and "collective_all_reduce_timed" not in by_step[2]
    )
    summaries = {step: values for _, step, values in step_summaries(rows, {"0": 4})}
    assert summaries[1]["coll.all_reduce.4.time_s"] == pytest.approx(0.3)
    assert summaries[1]["coll.all_reduce.4.bytes"] == 2 * 256 * 4
    assert "coll.all_reduce.4.time_s" not in summaries[2]
