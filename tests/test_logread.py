"""Reading a run log: segments in order, plain or gzipped, and every bad line skipped and counted by reason.

Logs are written by hand here (line by line) so each kind of damage is exactly where the test says.
"""

from __future__ import annotations

import gzip
import random

from trainmeter_core import records as rec
from trainmeter_core.logread import read_log, segments


def _line(record: rec.Record, seq: int) -> bytes:
    data = rec.check(rec.encode(record)).data
    data["seq"] = seq
    return rec.to_log_line(data)


def _steps(first: int, last: int) -> list[bytes]:
    return [_line(rec.Step(step=i), i) for i in range(first, last + 1)]


def test_each_bad_line_is_skipped_and_counted_with_its_reason(tmp_path):
    lines = [
        _line(rec.Step(step=1), 1),
        b'{"kind":"step","step":2,"source":"\xff\xfe"}\n',  # not UTF-8
        _line(rec.Step(step=3), 3),
        b'[{"kind":"step","step":4}]\n',  # a JSON array
        b'{"kind":"step","step":"x"}\n',  # a wrong payload type
        b"{not json\n",
        _line(rec.Step(step=7), 7),
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
        _line(rec.Step(step=1), 1),
        b'{"kind":"gpu.power_cap","watts":300,"seq":2}\n',
        _line(rec.Tick(n=1, interval_s=1.0), 3),
    ]
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    stats: dict = {}
    got = list(read_log(tmp_path, stats=stats))
    assert [rec.kind_of(r) for r in got] == ["step", "gpu.power_cap", "tick"]
    assert isinstance(got[1], rec.Unknown) and got[1].data["watts"] == 300 and got[1].seq == 2
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
    lines = [_line(rec.Step(step=1), 1), _line(rec.Tick(n=1, interval_s=1.0), 2), _line(rec.Step(step=2), 3)]
    (tmp_path / "events-0001.jsonl").write_bytes(b"".join(lines))
    assert [rec.kind_of(r) for r in read_log(tmp_path, kinds={"tick"})] == ["tick"]
    assert [r.step for r in read_log(tmp_path, kinds={"step"})] == [1, 2]


def test_fuzzed_lines_are_skipped_exactly_and_the_rest_equals_the_clean_log(tmp_path):
    seed = 424242
    print(f"seed={seed}")
    rng = random.Random(seed)
    clean = [
        _line(rng.choice([rec.Step(step=i), rec.Metric(values={"loss": rng.random()}, step=i)]), i)
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
    got = [rec.to_builtins(r) for r in read_log(tmp_path, stats=stats)]
    expected = [rec.to_builtins(rec.from_log_line(line)) for i, line in enumerate(clean) if i not in mutated]
    assert stats["skipped"] == len(mutated) == 60
    assert got == expected
