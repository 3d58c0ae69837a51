"""Replay speed: records per second through the engine for a synthetic 1M-record log, peak memory, and the time to
open a long run from the engine's checkpoint; plus N fuzzed golden logs (default 10,000).

Prints figures (and the ratio against a plain JSON decode of the same lines, measured in the same run); never fails on
a time. usage: python bench/bench_replay.py [--records N] [--fuzz N]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trainmeter_core import records as rec  # noqa: E402
from trainmeter_core.engine import Engine  # noqa: E402
from trainmeter_core.engine_component import load_checkpoint, save_checkpoint  # noqa: E402
from trainmeter_core.logread import read_log  # noqa: E402


def synthetic_log(path: Path, n: int) -> int:
    """A run of n records: 8 fake GPUs sampled at 1 Hz, 100 steps/s with a loss each, a tick each second."""
    enc = msgspec.json.Encoder()
    seq = 0
    t = 1000.0
    with open(path / "events-0001.jsonl", "wb") as f:

        def put(record: rec.Record) -> None:
            nonlocal seq
            seq += 1
            record.seq = seq
            f.write(enc.encode(record) + b"\n")

        put(
            rec.Fact(
                name="peak",
                value={"flops": 1e12, "label": "declared", "source": "bench", "device_type": "cpu"},
                provenance="declared",
                origin="--peak-tflops",
                t=t,
            )
        )
        put(
            rec.Fact(
                name="device",
                value={"type": "cpu", "index": None, "uuid": None},
                provenance="detected",
                origin="agent",
                rank=0,
                t=t,
            )
        )
        for name, value in (
            ("params", 124_000_000),
            ("embedding_params", 38_000_000),
            ("layers", 12),
            ("d_model", 768),
            ("seq_len", 1024),
            ("tokens_per_step", 524_288),
        ):
            put(rec.Fact(name=name, value=value, provenance="declared", origin=f"--{name}", t=t))
        step = 0
        while seq < n:
            for _ in range(100):
                step += 1
                t += 0.01
                put(rec.Step(step=step, step_time_s=0.01, t=t, rank=0))
                put(rec.Metric(values={"train_loss": 3.0 - step * 1e-6}, step=step, t=t))
            for gpu in range(8):
                put(
                    rec.SampleGpu(
                        index=gpu,
                        util_gpu=0.9,
                        sm_active=0.7,
                        tensor_active=0.4,
                        dram_active=0.3,
                        clock_sm_mhz=1755.0,
                        power_w=600.0,
                        t=t,
                        host="bench",
                    )
                )
            put(rec.Tick(n=step // 100, interval_s=1.0, t=t))
    return seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fuzz", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        n = synthetic_log(run, args.records)
        lines = (run / "events-0001.jsonl").read_bytes().splitlines()
        start = time.perf_counter()
        for line in lines:
            msgspec.json.decode(line)
        decode_s = time.perf_counter() - start
        engine = Engine()
        start = time.perf_counter()
        for record in read_log(run):
            engine.feed(record)
        replay_s = time.perf_counter() - start
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"replay of {n:,} records: {n / replay_s:,.0f} records/s ({replay_s:.1f} s; target >= 300k/s); "
            f"a bare JSON decode of the same lines: {n / decode_s:,.0f}/s (replay at {decode_s / replay_s:.2f}x of it)"
        )
        print(f"peak memory of this process: {peak_mb:.0f} MB")
        # One second of the synthetic run is 100 steps + 100 losses + 8 GPU samples + 1 tick = 209 records.
        per_run_second_ms = 209 / (n / replay_s) * 1000
        print(
            f"the live engine at 100 steps/s with 8 GPUs sampled at 1 Hz: {per_run_second_ms:.2f} ms of CPU per second "
            f"of the run = {per_run_second_ms / 10:.2f}% of a core (target <= 2%; log reading included)"
        )

        save_checkpoint(run, engine, n)
        start = time.perf_counter()
        restored, through = load_checkpoint(run)
        tail = 0
        for record in read_log(run):
            if record.seq is not None and record.seq > through:
                restored.feed(record)
                tail += 1
        print(
            f"open from the checkpoint ({(run / 'engine.ckpt').stat().st_size / 1e6:.1f} MB) and replay the tail "
            f"({tail} records, the whole log still read): {time.perf_counter() - start:.2f} s"
        )
    import test_golden

    start = time.perf_counter()
    names = test_golden.NAMES
    per = max(1, args.fuzz // len(names))
    for name in names:
        lines = (test_golden.GOLDEN / name / "events-0001.jsonl").read_bytes().splitlines(keepends=True)
        for case in range(per):
            rnd = random.Random(10_000 + case)
            chosen = sorted(rnd.sample(range(len(lines)), rnd.randint(1, 5)))
            mutated = list(lines)
            for i in chosen:
                mutated[i] = test_golden.mutate(lines[i], rnd)
            got = test_golden.final_of(mutated)
            want = test_golden.final_of([x for i, x in enumerate(lines) if i not in chosen])
            assert got == want, f"{name} seed={10_000 + case}"
    print(
        f"{per * len(names):,} fuzzed golden logs replayed, each equal to its clean log minus the mutated lines: "
        f"{time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
