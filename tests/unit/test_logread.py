"""Reading a run log: segments in order, plain or gzipped, and every bad line skipped and counted by reason.

Logs are written by hand here (line by line) so each kind of damage is exactly where the test says.
"""

from __future__ import annotations

import gzip
import random

from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log, segments
from trainmeter_core.runlog.tail import last_seq, tail_records


def _line(record: records.Record, seq: int) -> bytes:
    data = records.check(records.encode(record)).data
    data["seq"] = seq
    return records.to_log_line(data)


def _steps(first: int, last: int) -> list[bytes]:
    return [_line(records.Step(step=i), i) for i in range(first, last + 1)]


def test_each_bad_line_is_skipped_and_counted_with_its_reason(tmp_path):
    lines = [
        _line(records.Step(step=1), 1),
        b'{"kind":"step","step":2,"source":"\xff\xfe"}\n',  # not UTF-8
        _line(records.Step(step=3), 3),
        b'[{"kind":"step","step":4}]\n',  # a JSON array
        b'{"kind":"step","step":"x"}\n',  # a wrong payload type
        b"{not json\n",
        _line(records.Step(step=7), 7),
        b'{"kind":"step","step":8,"se',  # the last line, cut by a SIGKILL
    ]
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    stats: dict = {}
    assert [r.step for r in read_log(tmp_path, stats=stats)] == [1, 3, 7]
    # 5 bad lines: 2 that are not JSON (bad UTF-8, bad syntax), 1 array, 1 wrong type, 1 cut short.
    assert stats["skipped"] == 5
    assert stats["reasons"] == {
        "not JSON": 2,
        "not a mapping but list": 1,
        "step": 1,
        "truncated last line": 1,
    }


def test_unknown_kinds_are_kept_and_counted(tmp_path):
    lines = [
        _line(records.Step(step=1), 1),
        b'{"kind":"gpu.power_cap","watts":300,"seq":2}\n',
        _line(records.Tick(n=1, interval_s=1.0), 3),
    ]
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    stats: dict = {}
    got = list(read_log(tmp_path, stats=stats))
    assert [records.kind_of(r) for r in got] == ["step", "gpu.power_cap", "tick"]
    assert isinstance(got[1], records.Unknown) and got[1].data["watts"] == 300 and got[1].seq == 2
    assert (stats["unknown"], stats["skipped"]) == (1, 0)


def test_a_gzipped_segment_and_a_plain_one_are_read_in_order(tmp_path):
    (tmp_path / "events-0001.jsonl.gz").write_bytes(gzip.compress(b"".join(_steps(1, 3))))
    (tmp_path / "events-0002.jsonl").write_bytes(b"".join(_steps(4, 5)))
    (tmp_path / "events.jsonl.bak").write_bytes(b"".join(_steps(99, 99)))  # not a segment name
    assert [r.step for r in read_log(tmp_path)] == [1, 2, 3, 4, 5]


def test_a_segment_both_plain_and_gzipped_is_read_once_from_the_plain_one(tmp_path):
    # Compression finished but the plain file was not removed yet: the plain one is complete for sure.
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(_steps(1, 3)))
    (tmp_path / "events-0001.jsonl.gz").write_bytes(gzip.compress(b"".join(_steps(1, 2))))
    (tmp_path / "events-0002.jsonl").write_bytes(b"".join(_steps(4, 4)))
    assert [p.name for p in segments(tmp_path)] == ["events-0001.jsonl", "events-0002.jsonl"]
    assert [r.step for r in read_log(tmp_path)] == [1, 2, 3, 4]


def test_a_cut_line_inside_an_earlier_segment_is_a_truncated_line(tmp_path):
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(_steps(1, 2)) + b'{"kind":"st')
    (tmp_path / "events-0002.jsonl").write_bytes(b"".join(_steps(4, 4)))
    stats: dict = {}
    assert [r.step for r in read_log(tmp_path, stats=stats)] == [1, 2, 4]
    assert stats["reasons"] == {"truncated line": 1}


def test_a_corrupt_gzipped_segment_ends_early_and_the_next_segment_is_still_read(tmp_path):
    packed = bytearray(gzip.compress(b"".join(_steps(1, 5000))))
    for i in range(1000, 1064):
        packed[i] ^= 0x55  # damage that makes zlib fail (invalid distance), not only the CRC at the end
    (tmp_path / "events-0001.jsonl.gz").write_bytes(bytes(packed))
    (tmp_path / "events-0002.jsonl").write_bytes(b"".join(_steps(6000, 6001)))
    steps = [r.step for r in read_log(tmp_path)]  # once a zlib.error escaped from here
    # The segment ends where zlib gave up (here inside its first block: nothing of it), the next one is read.
    assert steps[:-2] == list(range(1, len(steps) - 1))
    assert steps[-2:] == [6000, 6001]


def test_kinds_filter_yields_only_those_kinds(tmp_path):
    lines = [
        _line(records.Step(step=1), 1),
        _line(records.Tick(n=1, interval_s=1.0), 2),
        _line(records.Step(step=2), 3),
    ]
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    assert [records.kind_of(r) for r in read_log(tmp_path, kinds={"tick"})] == ["tick"]
    assert [r.step for r in read_log(tmp_path, kinds={"step"})] == [1, 2]


def test_a_kinds_filter_passes_other_kinds_by_their_tag_but_still_counts_lines_that_are_no_record(tmp_path):
    lines = [
        _line(records.Step(step=1), 1),
        _line(
            records.Tick(n=1, interval_s=1.0), 2
        ),  # another kind, tag first: passed undecoded, its seq noted
        b"\x00\xff this is not a log\n",  # no tag to pass it by: decoded, and counted
        b'{"kind": 7}\n',  # likewise (the tag is not the recorder's)
        b'{"step":2,"kind":"step","seq":5}\n',  # a step written with its tag later: still found
    ]
    for bounded in (False, True):
        (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
        stats: dict = {}
        got = list(read_log(tmp_path, kinds={"step"}, stats=stats, before_seq=99 if bounded else None))
        assert [r.step for r in got] == [1, 2], bounded
        # 2 lines that are no record: the bytes that are not JSON, and a mapping whose kind is no string.
        assert stats["skipped"] == 2, bounded
        assert stats["last_seq"] == 5, bounded


def test_fuzzed_lines_are_skipped_exactly_and_the_rest_equals_the_clean_log(tmp_path):
    seed = 424242
    print(f"seed={seed}")
    rng = random.Random(seed)
    clean = [
        _line(rng.choice([records.Step(step=i), records.Metric(values={"loss": rng.random()}, step=i)]), i)
        for i in range(1, 401)
    ]
    mutated = set(rng.sample(range(len(clean)), 60))
    lines = list(clean)
    for i in mutated:
        how = rng.randrange(4)
        if how == 0:  # cut inside the JSON object, newline kept
            lines[i] = clean[i][: rng.randrange(1, len(clean[i]) - 2)] + b"\n"
        elif how == 1:  # an invalid UTF-8 byte inside a string
            lines[i] = clean[i].replace(b'"kind":"', b'"kind":"\xc3', 1)
        elif how == 2:  # binary garbage (0x00 can never start JSON)
            lines[i] = b"\x00" + rng.randbytes(rng.randrange(0, 40)).replace(b"\n", b"") + b"\n"
        else:  # a field of the wrong type (the seq, which ends every line, so no later key overrides it)
            lines[i] = clean[i].replace(b'"seq":', b'"seq":"x","was":', 1)
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    stats: dict = {}
    got = [records.to_builtins(r) for r in read_log(tmp_path, stats=stats)]
    expected = [
        records.to_builtins(records.from_log_line(line)) for i, line in enumerate(clean) if i not in mutated
    ]
    assert stats["skipped"] == len(mutated) == 60
    assert got == expected


def _mixed_log(rng: random.Random, n: int) -> list[bytes]:
    """Steps, metrics, ticks, GPU samples and alerts (a kind a replay passes), about 150 bytes a line as a real log."""
    lines = []
    for seq in range(1, n + 1):
        which = rng.randrange(10)
        if which < 4:
            record = records.Step(step=seq, step_time_s=0.01, t=seq / 100)
        elif which < 8:
            record = records.Metric(values={"train_loss": rng.random()}, step=seq, t=seq / 100)
        elif which == 8:
            record = records.SampleGpu(
                index=rng.randrange(8), power_w=600.0, sm_active=0.7, t=seq / 100, host="h"
            )
        elif seq % 3:
            record = records.Alert(
                rule="r", state="fired", severity="warning", message="m" * rng.randrange(80)
            )
        else:
            record = records.Tick(n=seq, interval_s=1.0, t=seq / 100)
        lines.append(_line(record, seq))
    return lines


def test_a_log_decoded_piece_by_piece_gives_what_the_line_by_line_reader_gives_damaged_or_not(
    tmp_path, monkeypatch
):
    from trainmeter_core.runlog import reader

    seed = 161616
    print(f"seed={seed}")
    rng = random.Random(seed)
    clean = _mixed_log(rng, 30_000)  # about 4 MiB: chunks of 1 MiB, pieces of 16 KiB
    damaged = list(clean)
    for i in rng.sample(range(len(clean)), 40):
        how = rng.randrange(4)
        if how == 0:
            damaged[i] = clean[i][: rng.randrange(1, len(clean[i]) - 2)] + b"\n"
        elif how == 1:
            damaged[i] = clean[i].replace(b'"kind":"', b'"kind":"\xc3', 1)
        elif how == 2:
            damaged[i] = b"\x00" + rng.randbytes(rng.randrange(0, 40)).replace(b"\n", b"") + b"\n"
        else:
            damaged[i] = clean[i].replace(b'"seq":', b'"seq":"x","was":', 1)
    for name, lines in (("clean", clean), ("damaged", damaged)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "events-0001.jsonl").write_bytes(b"".join(lines))
        for kinds in (None, {"step"}, {"step", "metric", "tick", "sample.gpu"}, {"step", "no.such.kind"}):
            by_piece: dict = {}
            got = [records.to_builtins(r) for r in read_log(run_dir, kinds, by_piece)]
            with monkeypatch.context() as patched:
                patched.setattr(reader, "_decoded_piece", lambda *args: None)
                by_line: dict = {}
                expected = [records.to_builtins(r) for r in read_log(run_dir, kinds, by_line)]
            assert got == expected, (name, kinds)
            assert by_piece == by_line, (name, kinds)
            assert by_piece["last_seq"] == 30_000
            # Every damaged line is counted (with kinds, one still tagged with another kind is passed by its tag).
            if kinds is None:
                assert by_piece["skipped"] == (40 if name == "damaged" else 0)
    # A clean log never goes line by line: each piece is decoded by one call.
    with monkeypatch.context() as patched:
        patched.setattr(reader, "_line_records", None)
        assert len(list(read_log(tmp_path / "clean", {"step", "metric"}))) == sum(
            1 for line in clean if line.startswith((b'{"kind":"step"', b'{"kind":"metric"'))
        )


# --------------------------------------------------------------------------------------------------------------------
# The tail after a checkpoint, and the log's end


def _segmented(tmp_path, per_segment: int, n_segments: int, gz_closed: bool = True) -> None:
    """Steps 1.. with seq = step, ``per_segment`` a segment; closed segments gzipped as the recorder leaves them."""
    for k in range(n_segments):
        first = k * per_segment + 1
        data = b"".join(_steps(first, first + per_segment - 1))
        closed = k < n_segments - 1
        name = f"events-{k + 1:04d}.jsonl"
        if closed and gz_closed:
            (tmp_path / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (tmp_path / name).write_bytes(data)


def test_after_seq_skips_whole_segments_and_decodes_only_the_tail(tmp_path):
    _segmented(
        tmp_path, per_segment=100, n_segments=5
    )  # seq 1..500, segments starting at 1, 101, 201, 301, 401
    stats: dict = {}
    assert [r.step for r in read_log(tmp_path, stats=stats, after_seq=350)] == list(range(351, 501))
    # Decoded in full: 150 records after seq 350, and the first line of segments 5 (seq 401 > 351, so on to
    # segment 4) and 4 (seq 301 <= 351: the tail starts there). Segments 1 to 3 are never opened; the 50 lines of
    # segment 4 at or before seq 350 are passed by their last key alone.
    assert stats["decoded"] == 150 + 2


def test_before_seq_stops_at_the_first_record_it_names(tmp_path):
    _segmented(tmp_path, per_segment=10, n_segments=3)
    stats: dict = {}
    assert [r.step for r in read_log(tmp_path, stats=stats, after_seq=5, before_seq=13)] == list(range(6, 13))
    assert stats["decoded"] == 7 + 2  # steps 6..12, and the first lines of segments 3 and 2 (seq 21, then 11)


def test_a_line_whose_seq_is_not_last_is_decoded_to_be_placed(tmp_path):
    # Written by hand (or by an older writer): the cheap look cannot place it, a full decode can.
    odd = records.to_log_line({"kind": "step", "seq": 3, "step": 3})
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join([*_steps(1, 2), odd, *_steps(4, 5)]))
    stats: dict = {}
    assert [r.step for r in read_log(tmp_path, stats=stats, after_seq=2)] == [3, 4, 5]
    assert stats["decoded"] == 3
    assert [r.step for r in read_log(tmp_path, after_seq=3)] == [4, 5]


def test_bad_lines_in_the_tail_are_still_skipped_and_counted_and_a_damaged_seq_lets_nothing_through_twice(
    tmp_path,
):
    lines = _steps(1, 6)
    lines[1] = lines[1].replace(
        b'"seq":2', b'"seq":"2"'
    )  # at or before after_seq, but unreadable: decoded, skipped
    lines[4] = b'{"kind":"step","step":5,"se\n'  # after after_seq: skipped and counted
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines) + b'{"kind":"step"')
    stats: dict = {}
    assert [r.step for r in read_log(tmp_path, stats=stats, after_seq=3)] == [4, 6]
    assert stats["skipped"] == 3 and stats["reasons"] == {"step": 1, "not JSON": 1, "truncated last line": 1}


def test_a_segment_whose_first_line_is_damaged_is_not_skipped_on_a_guess(tmp_path):
    _segmented(tmp_path, per_segment=10, n_segments=3, gz_closed=False)
    path = tmp_path / "events-0003.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[0] = (
        b"\x00garbage\n"  # seq 21's line; the segment's first seq is then read from its second line, 22
    )
    path.write_bytes(b"".join(lines))
    assert [r.step for r in read_log(tmp_path, after_seq=20)] == list(range(22, 31))
    assert [r.step for r in read_log(tmp_path, after_seq=25)] == list(range(26, 31))


def test_the_last_sequence_number_is_read_from_the_tail_and_a_cut_line_is_skipped(tmp_path):
    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    (tmp_path / "whole" / "events-0001.jsonl").write_bytes(b"".join(_steps(1, 5)))
    (tmp_path / "cut" / "events-0001.jsonl").write_bytes(b"".join(_steps(1, 5))[:-10])
    assert last_seq(tmp_path / "whole") == 5
    assert last_seq(tmp_path / "cut") == 4


def test_a_log_just_rotated_has_its_last_record_in_the_segment_before(tmp_path):
    _segmented(tmp_path, per_segment=10, n_segments=2)
    (tmp_path / "events-0003.jsonl").write_bytes(b"")  # opened by the rotation, nothing written yet
    assert last_seq(tmp_path) == 20


def test_the_tail_of_a_long_log_is_read_from_its_end(tmp_path):
    _segmented(tmp_path, per_segment=20_000, n_segments=1)  # about 1.5 MB, more than the tail that is read
    tail = tail_records(tmp_path)
    assert tail[-1].step == 20_000 and 1 < tail[0].step < 20_000  # a whole line first, never a cut one


def test_an_empty_run_directory_has_no_last_sequence_number(tmp_path):
    assert last_seq(tmp_path) is None


def test_a_long_plain_segment_is_bisected_and_a_gzipped_one_passed_by_chunks_to_the_same_tail(
    tmp_path, monkeypatch
):
    from trainmeter_core.runlog import reader

    monkeypatch.setattr(reader, "_CHUNK_B", 4096)  # about 55 lines a chunk: many chunks in a small log
    _segmented(tmp_path, per_segment=5000, n_segments=2)  # seq 1..5000 gzipped, 5001..10000 plain
    for after in (3, 2000, 4999, 5000, 5001, 7777, 9999, 10_000):
        stats: dict = {}
        assert [r.seq for r in read_log(tmp_path, stats=stats, after_seq=after)] == list(
            range(after + 1, 10_001)
        )
        # the tail, and the first line of segment 2, which tells whether segment 1 can be passed
        assert stats["decoded"] == (10_000 - after) + 1, after


def test_a_damaged_line_before_the_checkpoint_never_lets_a_record_through_twice(tmp_path, monkeypatch):
    from trainmeter_core.runlog import reader

    monkeypatch.setattr(reader, "_CHUNK_B", 4096)
    lines = _steps(1, 3000)
    for i in (1000, 1999, 2499):  # lines with seq 1001, 2000 and 2500, cut inside (their newline kept)
        lines[i] = lines[i][:20] + b"\n"
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    for after in (1500, 2600):
        expected = [
            seq for seq in range(after + 1, 3001) if seq not in (1001, 2000, 2500)
        ]  # the damaged ones lost
        assert [r.seq for r in read_log(tmp_path, after_seq=after)] == expected


def _rare_alerts_log(tmp_path, damaged: bool) -> None:
    """Two segments of about 3 MB of steps and metrics with an alert every 997 records, one last in a segment; with
    ``damaged``, one line in the middle is not a record at all."""
    lines = []
    for seq in range(1, 40_001):
        if seq % 997 == 0 or seq == 20_000:
            record = records.Alert(
                rule=f"rule{seq}", state="fired", severity="warning", message="m", subject="s"
            )
        elif seq % 2:
            record = records.Step(step=seq)
        else:
            record = records.Metric(values={"loss": seq / 7}, step=seq)
        lines.append(_line(record, seq))
    if damaged:
        lines[25_000] = b"{not json\n"
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines[:20_000]))
    (tmp_path / "events-0002.jsonl").write_bytes(b"".join(lines[20_000:]))


def test_a_read_of_a_rare_kind_finds_its_lines_by_search_and_gives_what_the_line_by_line_filter_gives(
    tmp_path, monkeypatch
):
    from trainmeter_core.runlog import reader

    for damaged in (False, True):
        run_dir = tmp_path / str(damaged)
        run_dir.mkdir()
        _rare_alerts_log(run_dir, damaged)
        kinds = {"alert", "run.start"}
        searched_stats: dict = {}
        searched = [(r.seq, r.rule) for r in read_log(run_dir, kinds, searched_stats)]
        with monkeypatch.context() as patched:
            patched.setattr(reader, "_sparse_lines", lambda *args: None)
            line_stats: dict = {}
            by_line = [(r.seq, r.rule) for r in read_log(run_dir, kinds, line_stats)]
        assert searched == by_line and len(searched) == 40_000 // 997 + 1
        assert (20_000, "rule20000") in searched  # the last line of the first segment
        assert searched_stats == line_stats
        assert searched_stats["last_seq"] == 40_000 and searched_stats["decoded"] == len(searched) + damaged
        assert searched_stats["skipped"] == damaged
