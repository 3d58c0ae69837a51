"""What reading a run log's tail costs: the look at a segment's first record that tells the reader whether to open it
(the per-segment index), and the tail after a checkpoint in the plain segment being written (bisected by offset) and in
a compressed one (passed in chunks), against reading the whole segment.

Prints figures; never fails on a time. usage: python bench/bench_logread.py [--mib 128]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainmeter_core.runlog.reader import first_seq, read_log  # noqa: E402

LINE = b'{"v":2,"kind":"step","t":%r,"wall":%r,"source":"agent","host":"node","pid":4242,"step":%d,"tokens_global":4096,"seq":%d}\n'  # noqa: E501


def timed(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mib", type=float, default=128.0, help="segment size (the recorder's default is 128 MiB)"
    )
    args = parser.parse_args()
    lines = []
    size = 0
    seq = 0
    while size < args.mib * 2**20:
        seq += 1
        line = LINE % (seq * 0.1, 1.7e9 + seq * 0.1, seq, seq)
        lines.append(line)
        size += len(line)
    data = b"".join(lines)
    del lines
    last = seq
    print(f"one segment of {len(data) / 2**20:.0f} MiB, {last:,} records")
    with tempfile.TemporaryDirectory() as tmp:
        plain, packed = Path(tmp) / "plain", Path(tmp) / "packed"
        plain.mkdir()
        packed.mkdir()
        (plain / "events-0001.jsonl").write_bytes(data)
        (packed / "events-0001.jsonl.gz").write_bytes(gzip.compress(data, compresslevel=6))
        probe_s = timed(lambda: first_seq(packed / "events-0001.jsonl.gz"), repeat=21)
        print(f"first record of the compressed segment (the index's look): {probe_s * 1e3:.2f} ms")
        for name, folder in (("plain (bisected)", plain), ("compressed (in chunks)", packed)):
            for tail in (1_000, 100_000):
                stats: dict = {}

                def tail_read(folder=folder, tail=tail, stats=stats):
                    stats.clear()
                    return sum(1 for _ in read_log(folder, stats=stats, after_seq=last - tail))

                print(
                    f"{name}: the {tail:,} records after a checkpoint in {timed(tail_read):.3f} s, "
                    f"{stats['decoded']:,} decoded"
                )
            whole = timed(lambda folder=folder: sum(1 for _ in read_log(folder)), repeat=1)
            print(f"{name}: the whole segment in {whole:.3f} s, {last:,} decoded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
