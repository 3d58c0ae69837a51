"""Records per second from one node to the job hub over tcp with CURVE, against plain tcp in the same run, and what
forwarding adds to a node's training step.

Three figures, each printed, none a pass or fail (speed targets are figures, not tests):
1. the whole path: records PUSHed into a node's hub, recorded there, forwarded by its forwarder over tcp + CURVE to a
   job hub in another process that checks, numbers and records them, until the job hub acknowledged the last one;
2. the link alone, in the same run: the same groups of records DEALER -> ROUTER over loopback tcp, with CURVE and
   without it, so the cost of the encryption is its own figure;
3. a node's step: a CPU-bound step loop timed while its hub takes an agent's records (three per step) with forwarding
   on and off, and the node hub process's CPU time per record forwarded.
usage: python bench/bench_job.py [--records N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainmeter_core.bus import jobkeys  # noqa: E402
from trainmeter_core.bus import jobwire as wire  # noqa: E402
from trainmeter_core.model import records  # noqa: E402

TARGET_PER_S = 100_000
NODE_HOST = "bench-node1"


def _steps(n: int) -> list[records.Step]:
    return [
        records.Step(
            step=i,
            t=1000.0 + i,
            wall=1.7e9 + i,
            source="agent",
            host=NODE_HOST,
            pid=7,
            rank=1,
            v=2,
            step_time_s=0.25,
            tokens=4096,
            tokens_source="input_ids",
        )
        for i in range(1, n + 1)
    ]


def job_hub_main(folder: str, keys_dir: str, ready, done, n: int) -> None:
    """A job hub (node rank 0) with its recorder, in a process of its own: reports its port, then when n records of
    the node arrived."""
    from trainmeter_core.bus.hub import Hub
    from trainmeter_core.runlog.recorder import Recorder

    run = Path(folder) / f"hub-{os.getpid()}"
    run.mkdir()
    recorder = Recorder(run)
    hub = Hub(f"ipc://{folder}/hin", f"ipc://{folder}/hout", recorder)
    hub.listen_job("tcp://127.0.0.1:0", jobkeys.load(Path(keys_dir)), 2, lambda line: None)
    recorder.start()
    hub.start()
    ready.put(hub.job.endpoint)
    while True:
        links = list(hub.job.links.values())
        if links and links[0].expect > n:
            done.put((time.monotonic(), time.process_time()))
            break
        time.sleep(0.001)
    hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=1.0))
    recorder.close()


def node_main(folder: str, keys_dir: str, endpoint: str | None, ready, report) -> None:
    """A node's hub (with its forwarder when ``endpoint``), in a process of its own; reports its CPU time on demand."""
    from trainmeter_core.bus.forward import Forwarder
    from trainmeter_core.bus.hub import Hub
    from trainmeter_core.runlog.recorder import Recorder

    run = Path(folder) / f"node-{os.getpid()}"
    run.mkdir()
    recorder = Recorder(run)
    hub = Hub(f"ipc://{folder}/nin", f"ipc://{folder}/nout", recorder)
    if endpoint is not None:
        hub.forwarder = Forwarder(endpoint, Path(keys_dir), 1, "bench", host=NODE_HOST)
        hub.forwarder.start()
    recorder.start()
    hub.start()
    ready.put(os.getpid())
    report.get()  # the measured part starts
    cpu = time.process_time()
    report.get()  # ... and ends
    cpu = time.process_time() - cpu
    if hub.forwarder is not None:
        hub.forwarder.finish(5.0)
    hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=1.0))
    recorder.close()
    ready.put(cpu)


def _push(endpoint: str, frames: list[list[bytes]]) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 1_000_000)
    sock.setsockopt(zmq.LINGER, 30_000)
    sock.connect(endpoint)
    for frame in frames:
        sock.send_multipart(frame)
    sock.close()
    ctx.term()


def whole_path(n: int, folder: str, keys_dir: str) -> float:
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Queue()
    hub = ctx.Process(target=job_hub_main, args=(folder, keys_dir, ready, done, n))
    hub.start()
    endpoint = ready.get(timeout=30)
    node_ready, node_stop = ctx.Queue(), ctx.Queue()
    node = ctx.Process(target=node_main, args=(folder, keys_dir, endpoint, node_ready, node_stop))
    node.start()
    node_ready.get(timeout=30)
    steps = _steps(n)
    # What an agent sends: batches of 100 records (it batches metrics the same way).
    frames = [[b"batch", records.encode_many(steps[i : i + 100])] for i in range(0, n, 100)]
    start = time.monotonic()
    _push(f"ipc://{folder}/nin", frames)
    node_stop.put("start")
    end, hub_cpu = done.get(timeout=300)
    node_stop.put("stop")
    node_cpu = node_ready.get(timeout=60)
    node.join(30)
    hub.join(30)
    print(
        f"  (CPU per record: node hub and forwarder {node_cpu / n * 1e6:.1f} us, job hub {hub_cpu / n * 1e6:.1f} us)"
    )
    return n / (end - start)


def link_alone(n: int, keys: jobkeys.JobKeys, curve: bool) -> float:
    """The same groups DEALER -> ROUTER over loopback tcp, receiver in this process, sender in another thread."""
    import threading

    import zmq

    payloads = [records.encode(s) for s in _steps(n)]
    groups = [
        [wire.RECS, wire.number(i + 1), wire.group(payloads[i : i + wire.GROUP_MAX])]
        for i in range(0, n, wire.GROUP_MAX)
    ]
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    if curve:
        public, secret = keys.hub_pair()
        router.curve_server, router.curve_publickey, router.curve_secretkey = True, public, secret
        node_public, node_secret = keys.node_pair(1)
        dealer.curve_publickey, dealer.curve_secretkey, dealer.curve_serverkey = (
            node_public,
            node_secret,
            public,
        )
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.setsockopt(zmq.SNDHWM, 64)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart([b"hi"])
    router.recv_multipart()

    def send() -> None:
        for group in groups:
            dealer.send_multipart(group)

    start = time.monotonic()
    sender = threading.Thread(target=send)
    sender.start()
    received = 0
    while received < n:
        frames = router.recv_multipart()
        received += len(records.split_batch(frames[3]))
    elapsed = time.monotonic() - start
    sender.join()
    dealer.close(0)
    router.close(0)
    ctx.term()
    return n / elapsed


def step_cost(folder: str, keys_dir: str, forward: bool, steps: int = 2000) -> tuple[float, float]:
    """(median step s, CPU s of the node hub's process per step) of a CPU-bound step loop sending an agent's three
    records per step to a node's hub, forwarding them to a job hub in a third process or not."""
    from trainmeter_core.bus.client import Producer

    ctx = mp.get_context("spawn")
    endpoint = None
    hub = None
    warmup = 50
    if forward:
        ready, done = ctx.Queue(), ctx.Queue()
        hub = ctx.Process(target=job_hub_main, args=(folder, keys_dir, ready, done, 3 * (steps + warmup)))
        hub.start()
        endpoint = ready.get(timeout=30)
    node_ready, node_ctl = ctx.Queue(), ctx.Queue()
    node = ctx.Process(target=node_main, args=(folder, keys_dir, endpoint, node_ready, node_ctl))
    node.start()
    node_ready.get(timeout=30)
    producer = Producer(f"ipc://{folder}/nin", "agent", rank=1)
    times = []
    work = list(range(20_000))
    for i in range(steps + warmup):
        if i == warmup:
            time.sleep(1.0)  # the link is up and the first records acknowledged: measure from here
            node_ctl.put("start")
        start = time.perf_counter()
        sum(x * x for x in work)  # the step's compute, about 1 ms
        producer.send(records.Step(step=i + 1, host=NODE_HOST, step_time_s=0.01, tokens=4096))
        producer.send(records.Metric(values={"loss": 2.0, "lr": 3e-4}, step=i + 1, host=NODE_HOST))
        producer.send(records.Phase(phase="data_wait", start_t=1.0, end_t=1.001, host=NODE_HOST))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    node_ctl.put("stop")
    cpu = node_ready.get(timeout=60)
    producer.close()
    node.join(30)
    if hub is not None:
        hub.join(60)
    return statistics.median(times), cpu / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="tmbj", dir="/tmp")
    try:
        keys = jobkeys.create(Path(folder) / "keys", "bench")
        keys_dir = str(Path(folder) / "keys")
        link_curve = link_alone(args.records, keys, curve=True)
        link_plain = link_alone(args.records, keys, curve=False)
        print(f"link alone, loopback tcp + CURVE: {link_curve:,.0f} records/s")
        print(
            f"link alone, loopback plain tcp:   {link_plain:,.0f} records/s (CURVE at {link_curve / link_plain:.0%})"
        )
        rate = whole_path(args.records, folder, keys_dir)
        verdict = "meets" if rate >= TARGET_PER_S else "misses"
        print(
            f"node hub -> forwarder -> job hub over tcp + CURVE, both recording: {rate:,.0f} records/s "
            f"({verdict} the {TARGET_PER_S:,} target)"
        )
        # Alternated, so that a change in the machine's load falls on both.
        runs = {False: [], True: []}
        for forward in (False, True, False, True):
            runs[forward].append(step_cost(folder, keys_dir, forward))
        plain_step = statistics.median(r[0] for r in runs[False])
        fwd_step = statistics.median(r[0] for r in runs[True])
        plain_cpu = statistics.median(r[1] for r in runs[False])
        fwd_cpu = statistics.median(r[1] for r in runs[True])
        print(
            f"a step of ~1 ms sending 3 records: median {plain_step * 1e3:.3f} ms without forwarding, "
            f"{fwd_step * 1e3:.3f} ms with ({(fwd_step - plain_step) * 1e6:+.1f} us); the node's tm process spends "
            f"{plain_cpu * 1e6:.1f} -> {fwd_cpu * 1e6:.1f} us of CPU per step (forwarding: "
            f"{(fwd_cpu - plain_cpu) * 1e6:+.1f} us, in tm's launcher at nice +5, never in the training process)"
        )
        print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
