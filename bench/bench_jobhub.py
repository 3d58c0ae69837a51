"""The job hub on one core: step rows per second from simulated nodes of a large job, one record per row (as nodes
sent them before blocks) against blocks of rows, in the same run, and how many rows were lost on the way.

Reproduce: ``.venv/bin/python bench/bench_jobhub.py [--nodes 64] [--ranks 8] [--steps 200] [--block-steps 1,10,100] [--gpus 8]``

The path measured is the job hub's whole side of the real one: ``nodes`` DEALER sockets, each with its own node key
(CURVE, through the job hub's ZAP allow-list), speak the forwarder's protocol (``hello``, then ``recs`` groups numbered
by the node's forwarding sequence, as big as a forwarder's groups grow under a backlog: ``jobwire.GROUP_MAX`` records
or ``GROUP_MAX_B`` bytes) to a job hub (``Hub.listen_job``) that checks, numbers, records (its recorder writing the log)
and publishes every record. Each rank of each node makes 3 rows a step, as a training loop does: its data wait, the
loss read at backward() and its step. The nodes' side (their own hubs and forwarders) is not measured: they are other
machines in a job. The job hub's process is pinned to one core, the simulated nodes' process to another; the figure
is rows over the wall clock from the first group sent until the last row is flushed to the log, beside the job hub
process's CPU per row (every thread: the hub's, the recorder's, ZeroMQ's). Lost: rows sent less rows in the log.

A block of ``b`` steps is what an agent sends when ``b`` steps fall in one flush window: at 10 steps/s a rank fills
one step per 100 ms, so the block size of a large job is set by the agent's flush interval, which is why several are
printed. A figure, never a pass or fail: the issue's target (42) is 15 times the one-record-per-row rate.

``--gpus N`` runs each block size again with every node's N GPUs sampled ``--gpu-hz`` times a second (default 2, the
sampler's beat), each sample a copy of a real H200 one from ``tests/fixtures/real`` (about 1.1 KB): GPU samples go
one record each, so a node's second costs the job hub its blocks and 16 samples (8 GPUs), and the line says how many
such nodes one core of it takes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from real_samples import real_gpu_sample  # noqa: E402

from trainmeter_core.bus import jobkeys  # noqa: E402
from trainmeter_core.bus import jobwire as wire  # noqa: E402
from trainmeter_core.model import records  # noqa: E402

RUN = "bench"
STEP_S = 0.1  # 10 steps/s per rank


def _host(node: int) -> str:
    return f"bench-node{node}"


def _rows_as_records(node: int, rank: int, first: int, steps: int) -> list[records.Record]:
    """A rank's rows, one record each, as an agent sent them before blocks."""
    header = {
        "v": records.SCHEMA_VERSION,
        "source": "agent",
        "host": _host(node),
        "pid": 1000 + rank,
        "rank": rank,
    }
    out: list[records.Record] = []
    for step in range(first, first + steps):
        end = 100.0 + step * STEP_S
        wall = 1.7e9 + end
        out.append(
            records.Phase(
                phase="data_wait",
                start_t=end - STEP_S,
                end_t=end - STEP_S + 0.02,
                step=step,
                probe="dataloader",
                t=end - STEP_S + 0.02,
                wall=wall - STEP_S + 0.02,
                **header,
            )
        )
        out.append(
            records.Metric(
                values={"train_loss": 2.0 + 1.0 / step},
                step=step,
                origin="backward",
                t=end - 0.01,
                wall=wall - 0.01,
                **header,
            )
        )
        out.append(
            records.Step(
                step=step,
                step_time_s=STEP_S,
                optimizers=1,
                micro_batches=1,
                tokens=4096,
                tokens_source="input_ids",
                dp=8,
                tokens_global=4096 * 8,
                t=end,
                wall=wall,
                **header,
            )
        )
    return out


def _rows_as_block(node: int, rank: int, first: int, steps: int) -> records.Block:
    """The same rows as one block."""
    numbers = list(range(first, first + steps))
    ends = [100.0 + step * STEP_S for step in numbers]
    return records.Block(
        rows=3 * steps,
        order="ps" * steps,
        step=numbers,
        step_t=ends,
        step_time_s=[STEP_S] * steps,
        optimizers=[1] * steps,
        agent_us=[None] * steps,
        micro_batches=[1] * steps,
        tokens=[4096] * steps,
        tokens_source="input_ids",
        dp=8,
        loss=[2.0 + 1.0 / step for step in numbers],
        loss_t=[end - 0.01 for end in ends],
        phase=["data_wait"] * steps,
        phase_start_t=[end - STEP_S for end in ends],
        phase_end_t=[end - STEP_S + 0.02 for end in ends],
        phase_step=numbers,
        phase_probe=["dataloader"] * steps,
        v=records.SCHEMA_VERSION,
        source="agent",
        host=_host(node),
        pid=1000 + rank,
        rank=rank,
        t=ends[-1],
        wall=1.7e9 + ends[-1],
    )


def _gpu_samples(
    real: records.SampleGpu, node: int, gpus: int, hz: float, first: int, count: int
) -> list[bytes]:
    """The node's GPUs sampled ``hz`` times a second over the steps ``first`` to ``first + count - 1`` (10 a second),
    each a copy of the real sample with this GPU's host, index, uuid and time."""
    out = []
    beats = range(math.ceil((first - 1) * STEP_S * hz), math.ceil((first - 1 + count) * STEP_S * hz))
    for beat in beats:
        t = 100.0 + beat / hz
        for index in range(gpus):
            sample = msgspec.structs.replace(
                real, host=_host(node), index=index, uuid=f"GPU-{node}-{index}", t=t, wall=1.7e9 + t, seq=None
            )
            out.append(records.encode(sample))
    return out


def _node_payloads(
    node: int,
    ranks: int,
    steps: int,
    block_steps: int,
    gpus: int = 0,
    hz: float = 0.0,
    real: records.SampleGpu | None = None,
) -> list[bytes]:
    """What one node forwards, in the order its hub took it: its ranks' flushes interleaved (0: one record a row),
    then, with ``gpus``, its GPUs' samples of the same seconds (copies of ``real``)."""
    payloads: list[bytes] = []
    chunk = block_steps or 1
    for first in range(1, steps + 1, chunk):
        count = min(chunk, steps + 1 - first)
        for rank in range(ranks):
            if block_steps:
                payloads.append(records.encode(_rows_as_block(node, rank, first, count)))
            else:
                payloads += [records.encode(r) for r in _rows_as_records(node, rank, first, count)]
        if gpus:
            assert real is not None, "a node's GPU samples are copies of a real one"
            payloads += _gpu_samples(real, node, gpus, hz, first, count)
    return payloads


def _groups(payloads: list[bytes]) -> list[list[bytes]]:
    """``recs`` messages as a forwarder with a backlog makes them."""
    out = []
    i = 0
    while i < len(payloads):
        start, size = i, 0
        while i < len(payloads) and i - start < wire.GROUP_MAX and size < wire.GROUP_MAX_B:
            size += len(payloads[i])
            i += 1
        out.append([wire.RECS, wire.number(start + 1), wire.group(payloads[start:i])])
    return out


def _pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})


def job_hub_main(
    folder: str, nodes: int, expected_rows: int, expected_samples: int, to_hub, from_hub
) -> None:
    """The job hub, pinned to one core: reports its endpoint, measures from "go" until every row is in its log."""
    _pin(0)
    from trainmeter_core.bus.hub import Hub
    from trainmeter_core.runlog.recorder import Recorder

    run = Path(folder) / "hub"
    run.mkdir()
    recorder = Recorder(run, reserve_b=0)
    hub = Hub(f"ipc://{folder}/in", f"ipc://{folder}/out", recorder, stats_every_s=3600.0)
    hub.listen_job("tcp://127.0.0.1:0", jobkeys.load(Path(folder) / "keys"), nodes + 1, lambda line: None)
    recorder.start()
    hub.start()
    from_hub.put(hub.job.endpoint)
    assert to_hub.get() == "go"
    wall, cpu = time.monotonic(), time.process_time()
    from_hub.put("started")

    def rows_in() -> int:
        kinds = hub.kinds
        return kinds.get("step", 0) + kinds.get("metric", 0) + kinds.get("phase", 0)

    deadline = wall + 600
    while (
        rows_in() < expected_rows
        or hub.kinds.get("sample.gpu", 0) < expected_samples
        or (recorder.flushed_seq or 0) < hub.seq
    ) and time.monotonic() < deadline:
        time.sleep(0.002)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    malformed = hub.malformed
    hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=wall))
    recorder.close()
    logged = samples = 0
    hosts = {_host(n) for n in range(1, nodes + 1)}
    # Segments in order, the closed ones gzipped (a log of blocks passes the 128 MiB segment limit).
    for segment in sorted(run.glob("events-*.jsonl*")):
        with (gzip.open if segment.suffix == ".gz" else open)(segment, "rb") as lines:
            for line in lines:
                record = json.loads(line)
                if record.get("host") in hosts:
                    if record["kind"] == "sample.gpu":
                        samples += 1
                    else:
                        logged += record["rows"] if record["kind"] == "block" else 1
    from_hub.put(
        {
            "wall_s": wall,
            "cpu_s": cpu,
            "logged": logged,
            "samples_logged": samples,
            "malformed": malformed,
            "queue_dropped": recorder.queue_dropped,
            "log_bytes": recorder.bytes_written,
        }
    )


def nodes_main(
    folder: str,
    endpoint: str,
    nodes: int,
    ranks: int,
    steps: int,
    block_steps: int,
    gpus: int,
    hz: float,
    to_nodes,
    ready,
):
    """The simulated nodes, pinned to another core: each says hello and is asked for its first record, then all
    send their groups in turn, a group per node at a time."""
    _pin(1)
    import zmq

    keys = jobkeys.load(Path(folder) / "keys")
    assert keys is not None
    real = real_gpu_sample() if gpus else None  # read from the fixture once, copied for every node's GPUs
    streams = [
        _groups(_node_payloads(node, ranks, steps, block_steps, gpus, hz, real))
        for node in range(1, nodes + 1)
    ]
    ctx = zmq.Context()
    socks = []
    for node in range(1, nodes + 1):
        sock = ctx.socket(zmq.DEALER)
        public, secret = keys.node_pair(node)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, keys.hub_pair()[0]
        sock.setsockopt(zmq.ROUTING_ID, f"{node}:{RUN}".encode())
        wire.tune(sock)
        sock.connect(endpoint)
        hello = wire.Hello(
            node_rank=node,
            host=_host(node),
            run=RUN,
            pid=os.getpid(),
            t=time.monotonic(),
            wall=time.time(),
            head=0,
            first=1,
        )
        sock.send_multipart([wire.HELLO, wire.pack(hello)])
        socks.append(sock)
    for sock in socks:  # every link is up and the job hub knows every node
        while sock.recv_multipart()[0] != wire.WANT:
            pass
    ready.put("ready")
    assert to_nodes.get() == "go"
    for i in range(max(len(s) for s in streams)):
        for sock, stream in zip(socks, streams, strict=True):
            if i < len(stream):
                sock.send_multipart(stream[i])
    ready.put("sent")
    to_nodes.get()  # the job hub has everything: close
    for sock in socks:
        sock.close(0)
    ctx.term()


def measure(nodes: int, ranks: int, steps: int, block_steps: int, gpus: int = 0, hz: float = 0.0) -> dict:
    folder = tempfile.mkdtemp(prefix="tmbjh", dir="/tmp")
    try:
        jobkeys.create(Path(folder) / "keys", RUN)
        ctx = mp.get_context("spawn")
        to_hub, from_hub, to_nodes, from_nodes = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
        expected = nodes * ranks * steps * 3
        samples = nodes * gpus * math.ceil(steps * STEP_S * hz) if gpus else 0
        hub = ctx.Process(target=job_hub_main, args=(folder, nodes, expected, samples, to_hub, from_hub))
        hub.start()
        endpoint = from_hub.get(timeout=60)
        sender = ctx.Process(
            target=nodes_main,
            args=(folder, endpoint, nodes, ranks, steps, block_steps, gpus, hz, to_nodes, from_nodes),
        )
        sender.start()
        assert from_nodes.get(timeout=600) == "ready"
        to_hub.put("go")
        assert from_hub.get(timeout=60) == "started"
        to_nodes.put("go")
        assert from_nodes.get(timeout=600) == "sent"
        figures = from_hub.get(timeout=900)
        to_nodes.put("close")
        sender.join(60)
        hub.join(60)
        figures["rows"] = expected
        figures["lost"] = expected - figures["logged"]
        figures["samples"] = samples
        figures["samples_lost"] = samples - figures["samples_logged"]
        figures["node_s"] = nodes * steps * STEP_S  # seconds of the nodes' work sent
        return figures
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--steps", type=int, default=200, help="steps per rank, one record a row")
    parser.add_argument(
        "--block-steps",
        default="1,10,100",
        help="steps per block, comma-separated; blocks of b steps run min(b, 10) times --steps per rank",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="also, for each block size, the same run with this many GPUs a node sampled (a real H200 sample each)",
    )
    parser.add_argument("--gpu-hz", type=float, default=2.0, help="samples a GPU a second (the sampler's: 2)")
    args = parser.parse_args()
    sizes = [int(x) for x in args.block_steps.split(",") if x]
    print(
        f"reproduce: {sys.executable} bench/bench_jobhub.py --nodes {args.nodes} --ranks {args.ranks} "
        f"--steps {args.steps} --block-steps {args.block_steps}"
        + (f" --gpus {args.gpus} --gpu-hz {args.gpu_hz:g}" if args.gpus else "")
    )
    print(f"{args.nodes} nodes x {args.ranks} ranks, 3 rows a step; job hub on one core of {os.cpu_count()}")
    baseline = None
    for block_steps in [0, *sizes]:
        steps = args.steps * min(block_steps, 10) if block_steps else args.steps
        f = measure(args.nodes, args.ranks, steps, block_steps)
        rate = f["rows"] / f["wall_s"]
        what = f"blocks of {block_steps} steps" if block_steps else "one record a row"
        ratio = "" if baseline is None else f" | {rate / baseline:.1f}x one record a row"
        print(
            f"{what:>22}: {rate:>12,.0f} rows/s | {f['cpu_s'] / f['rows'] * 1e6:.2f} us CPU a row | "
            f"{f['rows']:,} rows in {f['wall_s']:.2f} s | lost {f['lost']} | malformed {f['malformed']} | "
            f"log queue dropped {f['queue_dropped']} | "
            f"log {f['log_bytes'] / f['rows']:.0f} B a row{ratio}"
        )
        if baseline is None:
            baseline = rate
        if args.gpus and block_steps:
            # The same seconds of the same nodes with their GPUs' samples: what a node's second costs the job hub
            # with and without them, and so how many such nodes one core of it takes
            g = measure(args.nodes, args.ranks, steps, block_steps, args.gpus, args.gpu_hz)
            bare_ms, with_ms = (x["cpu_s"] / x["node_s"] * 1e3 for x in (f, g))
            print(
                f"{'+ ' + str(args.gpus) + ' GPUs at ' + format(args.gpu_hz, 'g') + ' Hz':>22}: job hub CPU a "
                f"node-second {with_ms:.3f} ms against {bare_ms:.3f} without the samples ("
                f"{(g['cpu_s'] - f['cpu_s']) / max(g['samples'], 1) * 1e6:.1f} us a sample.gpu): one core takes about "
                f"{1e3 / with_ms:,.0f} such nodes, {1e3 / bare_ms:,.0f} without | {g['samples']:,} samples, lost "
                f"{g['samples_lost']}, rows lost {g['lost']} | malformed {g['malformed']} | log queue dropped "
                f"{g['queue_dropped']}"
            )
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
