"""Replay speed: records per second through the engine for a synthetic 1M-record log (steady steps as today's agent
sends them: a data wait, the loss read at backward() and a full step record each) and peak memory, beside trainmeter
0.0.7 (the previous generation) replaying the same run (the same steps and seconds) as 0.0.7 writes it (its steps and
data waits summed per 50 ms, the loss emitted), compared per step of the run as well as per record; the time to open a long run from the
engine's checkpoint; plus N fuzzed golden logs (default 10,000).

Prints figures (and ratios against 0.0.7 and a plain JSON decode of the same lines, measured in the same run); never
fails on a time. Each replay runs in a fresh process of its own, so its peak memory is its own; rounds alternate.
usage: python bench/bench_replay.py [--records N] [--fuzz N] [--rounds N] [--peer-venv /work/peer] [--block-steps N] [--emit-every N]
Targets (issue 16): >= 365k records/s and <= 200 MB for 1M records.

The block log (issue 42): ``--block-steps`` steps (default 1M) of the same run as the agent sends them now, its steps,
losses and data waits in blocks of at most 1,000 rows (333 steps: one flush), the GPU samples (8 GPUs once a second,
each a copy of a real H200's NVML sample: about 1 KB with its GPM window and energy counter) and ticks of those
seconds after each block (the hub numbers a block when it arrives). Its replay (``final_snapshot``, a fresh process)
beside a bare ``msgspec.json`` decode of the same file into typed records (``records.Block`` for its blocks). Targets:
replay at least half the speed of that decode, peak memory <= 200 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from real_samples import real_gpu_sample  # noqa: E402

from trainmeter_core.model import records  # noqa: E402
from trainmeter_core.model.engine import Engine  # noqa: E402
from trainmeter_core.runlog.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from trainmeter_core.runlog.reader import read_log  # noqa: E402

# One second of the synthetic run: STEPS_PER_S steps, GPUS GPUs sampled once, one tick.
STEPS_PER_S = 100
GPUS = 8
STEP_S = 1.0 / STEPS_PER_S
DATA_WAIT_S = 0.0004  # each step starts with a DataLoader wait of this long
PEER_FLUSH_S = 0.05  # 0.0.7's agent sends its step and data-wait records at most every 50 ms (FLUSH_INTERVAL)


def synthetic_log(path: Path, n: int) -> tuple[int, int]:
    """A run of about n records as today's tm writes it (``events-0001.jsonl``, the recorder's field order, the hub's
    stamp): the agent's facts, then per steady step what the agent sends today, read from a real run of the tight
    loop: the DataLoader's ``data_wait`` phase (start_t, end_t, the step it follows), the loss read at ``backward()``
    (a metric with ``origin="backward"``) and the step record with every field a steady step carries (step_time_s,
    micro_batches, tokens and their source, tokens_global, dp, optimizers; agent_us one step in 16); 8 fake GPUs
    sampled at 1 Hz and the launcher's tick each second. Returns (records, steps)."""
    seq = 0
    t, wall = 1000.0, 1.8e9
    with open(path / "events-0001.jsonl", "wb") as f:

        def put(record: records.Record) -> None:
            nonlocal seq
            seq += 1
            record.seq, record.v = seq, records.SCHEMA_VERSION
            record.host, record.wall = "bench", wall + (record.t - 1000.0)
            if record.source == "agent":
                record.pid = 4242
            data = records.to_builtins(record)
            data["seq"] = data.pop("seq")  # as the recorder writes it: the hub appends seq last
            f.write(records.to_log_line(data))

        put(
            records.Fact(
                name="peak",
                value={"flops": 1e12, "label": "declared", "source": "bench", "device_type": "cpu"},
                provenance="declared",
                origin="--peak-tflops",
                t=t,
            )
        )
        put(
            records.Fact(
                name="device",
                value={"type": "cpu", "index": None, "uuid": None},
                provenance="detected",
                origin="agent",
                source="agent",
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
            put(records.Fact(name=name, value=value, provenance="declared", origin=f"--{name}", t=t))
        step = 0
        while seq < n:
            for _ in range(STEPS_PER_S):
                # The wait for this step's batch is recorded against the step before it, as the agent does.
                put(
                    records.Phase(
                        phase="data_wait",
                        start_t=t,
                        end_t=t + DATA_WAIT_S,
                        step=step or None,
                        probe="dataloader",
                        source="agent",
                        t=t + DATA_WAIT_S,
                    )
                )
                step += 1
                t += STEP_S
                put(
                    records.Metric(
                        values={"train_loss": 3.0 - step * 1e-6},
                        step=step,
                        origin="backward",
                        source="agent",
                        t=t,
                    )
                )
                put(
                    records.Step(
                        step=step,
                        step_time_s=STEP_S,
                        micro_batches=1,
                        tokens=524_288,
                        tokens_source="input_ids",
                        tokens_global=524_288,
                        dp=1,
                        optimizers=1,
                        agent_us=30.0 if step % 16 == 0 else None,
                        source="agent",
                        t=t,
                    )
                )
            for gpu in range(GPUS):
                put(
                    records.SampleGpu(
                        index=gpu,
                        util_gpu=0.9,
                        sm_active=0.7,
                        tensor_active=0.4,
                        dram_active=0.3,
                        clock_sm_mhz=1755.0,
                        power_w=600.0,
                        source="gpu",
                        t=t,
                    )
                )
            put(records.Tick(n=step // STEPS_PER_S, interval_s=1.0, source="launcher", t=t))
    return seq, step


#: A block's rows at most: one flush of the agent.
BLOCK_ROWS = 1_000


def _gpu_sample(real: records.SampleGpu, gpu: int, t: float, elapsed_s: float) -> records.SampleGpu:
    """GPU ``gpu``'s sample at ``t``: a copy of the real one on its own GPU, its GPM window the second before ``t`` and
    its energy counter risen at the real sample's power since the run began."""
    return msgspec.structs.replace(
        real,
        index=gpu,
        uuid=f"GPU-bench-{gpu}",
        host="bench",
        t=t,
        wall=None,
        seq=None,
        gpm_window_s=1.0,
        gpm_window_start_t=t - 1.0,
        energy_j=(real.energy_j or 0.0) + (real.power_w or 0.0) * elapsed_s,
    )


def block_log(path: Path, steps: int, emit_every: int = 0) -> tuple[int, int]:
    """The run of ``synthetic_log``, ``steps`` steps of it, as the agent sends it now: its facts, then per flush one
    block of 333 steps (each step's data wait, loss and step: 999 rows; with ``emit_every``, a learning rate the loop
    emits after every that many steps, as a loop that logs it does) and the GPU samples (``_gpu_sample``) and ticks
    of those seconds (numbered after the block, which the hub numbers when it arrives). Returns (records the log
    stands for, lines)."""
    from blocks import block_of

    real = real_gpu_sample()
    seq = lines = 0
    t, wall = 1000.0, 1.8e9
    agent = {"source": "agent", "host": "bench", "pid": 4242, "v": records.SCHEMA_VERSION}
    with open(path / "events-0001.jsonl", "wb") as f:

        def write(record: records.Record) -> None:
            nonlocal lines
            lines += 1
            data = records.to_builtins(record)
            data["seq"] = data.pop("seq")  # as the recorder writes it: the hub appends seq last
            f.write(records.to_log_line(data))

        def numbered(record: records.Record) -> records.Record:
            nonlocal seq
            seq += 1
            record.seq, record.v, record.host = seq, records.SCHEMA_VERSION, "bench"
            record.wall = wall + (record.t - 1000.0)
            return record

        write(numbered(records.Fact(name="peak", value={"flops": 1e12, "label": "declared", "source": "bench",
                                                        "device_type": "cpu"},
                                    provenance="declared", origin="--peak-tflops", t=t)))  # fmt: skip
        for name, value in (
            ("params", 124_000_000),
            ("layers", 12),
            ("d_model", 768),
            ("tokens_per_step", 524_288),
        ):
            write(
                numbered(records.Fact(name=name, value=value, provenance="declared", origin=f"--{name}", t=t))
            )
        step = 0
        per_block = BLOCK_ROWS // 3
        while step < steps:
            rows: list[records.Record] = []
            after: list[records.Record] = []
            for _ in range(min(per_block, steps - step)):
                rows.append(records.Phase(phase="data_wait", start_t=t, end_t=t + DATA_WAIT_S, step=step or None,
                                          probe="dataloader", t=t + DATA_WAIT_S, **agent))  # fmt: skip
                step += 1
                t += STEP_S
                rows.append(records.Metric(values={"train_loss": 3.0 - step * 1e-6}, step=step, origin="backward",
                                           t=t, **agent))  # fmt: skip
                rows.append(records.Step(step=step, step_time_s=STEP_S, micro_batches=1, tokens=524_288,
                                         tokens_source="input_ids", tokens_global=524_288, dp=1, optimizers=1,
                                         agent_us=30.0 if step % 16 == 0 else None, t=t, **agent))  # fmt: skip
                if emit_every and step % emit_every == 0:
                    rows.append(records.Metric(values={"lr": 3e-4}, step=step, origin="emit", t=t, **agent))
                if step % STEPS_PER_S == 0:
                    for gpu in range(GPUS):
                        after.append(_gpu_sample(real, gpu, t, t - 1000.0))
                    after.append(records.Tick(n=step // STEPS_PER_S, interval_s=1.0, source="launcher", t=t))
            for row in rows:
                numbered(row)
            write(block_of(rows))
            for record in after:
                write(numbered(record))
    return seq, lines


def peer_log(path: Path, steps: int) -> int:
    """The same run (the same steps, the same seconds) as trainmeter 0.0.7 writes it (``events.jsonl``, read from a
    run of the tight loop under 0.0.7): ``{"v", "t", "src", "rank", "pid", "kind", "d"}``; its agent adds up the steps
    and the DataLoader waits and sends them at most every 50 ms, a ``phase`` (``{"name": "data", "s", "n"}``) then a
    ``step`` (``{"n": last step, "k": steps in it, "micro", "tokens"}``); 0.0.7 reads no loss at backward, so the loop
    emits it, a ``metric`` per step (``via: "emit"``); one ``sample.gpu`` a second holds every GPU's row. Returns
    the records written."""
    count = 0
    t = 1000.0
    with open(path / "events.jsonl", "w") as f:

        def put(kind: str, src: str, d: dict, agent: bool = False) -> None:
            nonlocal count
            count += 1
            head = {"v": 1, "t": t, "src": src}
            if agent:
                head.update(rank=0, pid=4242)
            f.write(json.dumps({**head, "kind": kind, "d": d}) + "\n")

        put(
            "run.start", "supervisor", {"argv": ["python", "train.py"], "tm_version": "0.0.7", "declared": {}}
        )
        put("hello", "agent", {"attached": True, "trainmeter": "0.0.7", "python": "3.11.7"}, agent=True)
        put("fact", "declared", {"key": "peak_tflops", "value": 1.0, "source": "declared"})
        for key, value in (
            ("n_params", 124_000_000),
            ("layers", 12),
            ("d_model", 768),
            ("seq_len", 1024),
            ("tokens_per_step", 524_288),
        ):
            put("fact", "declared", {"key": key, "value": value, "source": "declared"})
        rows = [
            {
                "index": gpu,
                "util_gpu": 90.0,
                "sm_active": 0.7,
                "tensor_active": 0.4,
                "dram_active": 0.3,
                "clock_sm_mhz": 1755.0,
                "power_w": 600.0,
            }
            for gpu in range(GPUS)
        ]
        per_flush = round(PEER_FLUSH_S / STEP_S)
        step = 0
        while step < steps:
            for _ in range(STEPS_PER_S // per_flush):
                for _ in range(per_flush):
                    step += 1
                    t += STEP_S
                    put(
                        "metric",
                        "emit",
                        {"key": "train_loss", "value": 3.0 - step * 1e-6, "via": "emit"},
                        True,
                    )
                put("phase", "agent", {"name": "data", "s": DATA_WAIT_S * per_flush, "n": per_flush}, True)
                put(
                    "step",
                    "agent",
                    {"n": step, "k": per_flush, "micro": per_flush, "tokens": 524_288 * per_flush},
                    True,
                )
            put("sample.gpu", "gpu", {"gpus": rows})
    return count


_OURS = """
import json, resource, sys, time
from pathlib import Path
from trainmeter_core.runlog import replay
started, cpu = time.perf_counter(), time.process_time()
snapshot = replay.final_snapshot(Path(sys.argv[1]), use_checkpoint=False)
elapsed_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
print(json.dumps({"s": elapsed_s, "cpu_s": cpu_s, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "steps": snapshot.steps}))
"""
_PEERS = """
import json, resource, sys, time
from pathlib import Path
from trainmeter.replay import replay
started, cpu = time.perf_counter(), time.process_time()
replayed = replay(Path(sys.argv[1]))
elapsed_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
print(json.dumps({"s": elapsed_s, "cpu_s": cpu_s, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "steps": replayed.snapshot.get("steps")}))
"""


def _replay_in_process(python: str, code: str, run: Path, env: dict) -> dict | None:
    done = subprocess.run([python, "-c", code, str(run)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"  replay failed: {done.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(rates: list[float]) -> str:
    """The rounds' range, so one slow spell of the host shows beside the median."""
    return f"{min(rates):,.0f} to {max(rates):,.0f} over the rounds"


def side_by_side(n: int, rounds: int, peer_venv: str | None) -> None:
    """tm's replay (``final_snapshot``, what ``tm view --json`` and the end of a run do) and 0.0.7's ``replay``, each
    in a fresh process, alternated."""
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(repo))
    peer_python = os.path.join(peer_venv, "bin", "python") if peer_venv else None
    if peer_python and not os.path.exists(peer_python):
        print(f"0.0.7 not found in {peer_venv}: its column is left out")
        peer_python = None
    with tempfile.TemporaryDirectory() as tmp:
        ours_dir, peer_dir = Path(tmp) / "tm", Path(tmp) / "peer"
        ours_dir.mkdir()
        peer_dir.mkdir()
        n_ours, steps = synthetic_log(ours_dir, n)
        n_peer = peer_log(peer_dir, steps) if peer_python else 0
        ours, peers = [], []
        for _ in range(rounds):
            result = _replay_in_process(sys.executable, _OURS, ours_dir, env)
            if result is not None:
                ours.append(result)
            if peer_python:
                result = _replay_in_process(
                    peer_python, _PEERS, peer_dir, {k: v for k, v in env.items() if k != "PYTHONPATH"}
                )
                if result is not None:
                    peers.append(result)
        if not ours:
            return
        rates = [n_ours / r["s"] for r in ours]
        rate = statistics.median(rates)
        cpu_rate = statistics.median(n_ours / r["cpu_s"] for r in ours)
        peak = max(r["peak_mb"] for r in ours)
        step_rate = statistics.median(steps / r["s"] for r in ours)
        print(
            f"tm replay of {n_ours:,} records ({steps:,} steps), fresh process: {rate:,.0f} records/s wall "
            f"= {step_rate:,.0f} steps of the run/s, {cpu_rate:,.0f} records per CPU second (median of {len(ours)}, "
            f"wall {_spread(rates)}; target >= 365k/s), peak memory {peak:.0f} MB (target <= 200 MB); {_load()}"
        )
        if peers:
            peer_rates = [n_peer / r["s"] for r in peers]
            peer_rate = statistics.median(peer_rates)
            peer_cpu_rate = statistics.median(n_peer / r["cpu_s"] for r in peers)
            peer_peak = max(r["peak_mb"] for r in peers)
            peer_step_rate = statistics.median(steps / r["s"] for r in peers)
            seen = {r["steps"] for r in peers} | {r["steps"] for r in ours}
            print(
                f"0.0.7 replay of the same run, {n_peer:,} records as 0.0.7 writes it, fresh process: "
                f"{peer_rate:,.0f} records/s wall ({_spread(peer_rates)}) = {peer_step_rate:,.0f} steps of the "
                f"run/s, {peer_cpu_rate:,.0f} records per CPU second, peak memory {peer_peak:.0f} MB; tm/0.0.7: "
                f"{step_rate / peer_step_rate:.2f}x the steps/s (the same run), {rate / peer_rate:.2f}x the "
                f"records/s, memory {peak / peer_peak:.2f}x; steps in the snapshots {sorted(seen)}"
            )
        print(
            f"  reproduce: {sys.executable} bench/bench_replay.py --records {n} --rounds {rounds} --fuzz 0"
            + (f" --peer-venv {peer_venv}" if peer_venv else "")
        )


_BARE_DECODE = """
import json, sys, time
import msgspec
from trainmeter_core.model import records
data = open(sys.argv[1] + "/events-0001.jsonl", "rb").read()
decoder = msgspec.json.Decoder(records.AnyRecord)
lines = data.splitlines()
decoder.decode(lines[0])
started = time.perf_counter()
for line in lines:
    decoder.decode(line)
print(json.dumps({"s": time.perf_counter() - started}))
"""


def blocks_side_by_side(steps: int, rounds: int, emit_every: int = 0) -> None:
    """The replay of a log of blocks (``final_snapshot``, a fresh process) and a bare typed decode of its lines (a
    fresh process too), alternated."""
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(repo))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        n, lines = block_log(run, steps, emit_every)
        size_mb = (run / "events-0001.jsonl").stat().st_size / 1e6
        replays, decodes = [], []
        for _ in range(rounds):
            result = _replay_in_process(sys.executable, _OURS, run, env)
            if result is not None:
                replays.append(result)
            result = _replay_in_process(sys.executable, _BARE_DECODE, run, env)
            if result is not None:
                decodes.append(result)
        if not replays or not decodes:
            return
        replay_s = statistics.median(r["s"] for r in replays)
        decode_s = statistics.median(r["s"] for r in decodes)
        peak = max(r["peak_mb"] for r in replays)
        seen = sorted({r["steps"] for r in replays})
        print(
            f"tm replay of a block log, {steps:,} steps"
            + (f" (a metric emitted every {emit_every})" if emit_every else "")
            + f" = {n:,} records in {lines:,} lines ({size_mb:.0f} MB), fresh "
            f"process: {replay_s:.2f} s = {n / replay_s:,.0f} records/s = {steps / replay_s:,.0f} steps/s "
            f"(rounds {min(r['s'] for r in replays):.2f} to {max(r['s'] for r in replays):.2f} s), peak memory "
            f"{peak:.0f} MB (target <= 200 MB); a bare msgspec.json decode of its lines into typed records: "
            f"{decode_s:.2f} s (rounds {min(r['s'] for r in decodes):.2f} to {max(r['s'] for r in decodes):.2f} s); "
            f"replay at {decode_s / replay_s:.3f}x of the decode's speed (target >= 0.5x); steps in the snapshot "
            f"{seen}; {_load()}"
        )
        print(
            f"  reproduce: {sys.executable} bench/bench_replay.py --block-steps {steps} --rounds {rounds} --only-blocks"
            + (f" --emit-every {emit_every}" if emit_every else "")
        )


def _load() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fuzz", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer-venv", default=os.environ.get("TM_PEER_VENV") or "/work/peer")
    parser.add_argument("--block-steps", type=int, default=1_000_000)
    parser.add_argument("--only-blocks", action="store_true", help="only the block log's replay and decode")
    parser.add_argument(
        "--emit-every",
        type=int,
        default=0,
        help="the block log's loop emits a metric every N steps (0: never)",
    )
    args = parser.parse_args()
    if args.block_steps:
        blocks_side_by_side(args.block_steps, args.rounds, args.emit_every)
    if args.only_blocks:
        return
    side_by_side(args.records, args.rounds, args.peer_venv)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        n, _ = synthetic_log(run, args.records)
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
            f"every snapshot built (the live engine's work): {n / replay_s:,.0f} records/s ({replay_s:.1f} s); "
            f"a bare JSON decode of the same lines: {n / decode_s:,.0f}/s (replay at {decode_s / replay_s:.2f}x of it)"
        )
        print(f"peak memory of this process: {peak_mb:.0f} MB")
        # One second of the synthetic run: 100 steps, each with its data wait and its loss, 8 GPU samples, a tick.
        per_run_second_ms = (3 * STEPS_PER_S + GPUS + 1) / (n / replay_s) * 1000
        print(
            f"the live engine at 100 steps/s with 8 GPUs sampled at 1 Hz: {per_run_second_ms:.2f} ms of CPU per second "
            f"of the run = {per_run_second_ms / 10:.2f}% of a core (target <= 2%; log reading included)"
        )

        for behind in (0, 1000):
            at = Engine()
            for record in read_log(run, before_seq=n - behind + 1):
                at.feed(record, snapshots=False)
            save_checkpoint(run, at, n - behind)
            start = time.perf_counter()
            restored, through = load_checkpoint(run)
            stats: dict = {}
            tail = 0
            for record in read_log(run, stats=stats, after_seq=through):
                restored.feed(record)
                tail += 1
            print(
                f"open from the checkpoint ({(run / 'engine.ckpt').stat().st_size / 1e6:.1f} MB) and replay the tail "
                f"({tail} records, {stats['decoded']} lines decoded): {time.perf_counter() - start:.2f} s"
            )
    if not args.fuzz:
        return
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
