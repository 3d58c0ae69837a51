"""Records per second through the hub (PULL -> check -> seq -> recorder -> XPUB) to one subscriber in another process.

Prints figures and the ratio against a baseline measured in the same run: the same bytes sent PUSH -> PULL straight to
a process that decodes them the same way, with no hub in between. Never fails on a time; speed targets are figures.
usage: python bench/bench_bus.py [--records N] [--batch 1,100]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainmeter_core.bus import client as bus  # noqa: E402
from trainmeter_core.model import records  # noqa: E402

TARGET_PER_S = 150_000
IDLE_GIVE_UP_S = 30.0


def _frames(n: int, batch: int) -> list[list[bytes]]:
    """The producer's messages, encoded before the clock starts: what an agent sends for n training steps."""
    host, pid = socket.gethostname(), os.getpid()
    steps = [
        records.Step(
            step=i,
            t=1000.0 + i * 0.25,
            wall=1.7e9 + i * 0.25,
            source="agent",
            host=host,
            pid=pid,
            rank=0,
            step_time_s=0.25,
            tokens=4096,
            tokens_source="input_ids",
        )
        for i in range(n)
    ]
    if batch == 1:
        return [[b"step", records.encode(s)] for s in steps]
    return [[bus.BATCH_TOPIC, records.encode_many(steps[i : i + batch])] for i in range(0, n, batch)]


def producer_main(endpoint: str, n: int, batch: int, go, results) -> None:
    import zmq

    frames = _frames(n, batch)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.LINGER, 10_000)
    sock.connect(endpoint)
    go.wait()
    start_t = time.monotonic()
    for message in frames:
        sock.send_multipart(message)  # blocking: the bench measures the receiving side, not drops
    results.put(("producer", start_t, time.monotonic()))
    sock.close()
    ctx.term()


def subscriber_main(endpoint: str, n: int, ready, results) -> None:
    """Through the hub: a typed Subscriber, as a component would use it."""
    sub = bus.Subscriber(endpoint)
    got, last_t, idle_since = 0, None, None
    while got < n:
        record = sub.recv(0.05)
        now = time.monotonic()
        if record is None:
            idle_since = idle_since or now
            if ready.is_set() and now - idle_since > IDLE_GIVE_UP_S:
                break
            continue
        idle_since = None
        ready.set()  # the first probe came through: the subscription is live
        if type(record) is records.Step:
            got += 1
            last_t = now
    results.put(("subscriber", last_t, got, sub.gaps, sub.malformed))
    sub.close()


def pull_main(endpoint: str, n: int, ready, results) -> None:
    """The baseline: the producer's bytes straight into a PULL, decoded as the subscriber decodes them."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 1_000_000)
    sock.bind(endpoint)
    ready.set()
    got, last_t = 0, None
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while got < n:
        if not poller.poll(IDLE_GIVE_UP_S * 1000):
            break
        topic, body = sock.recv_multipart()
        payloads = records.split_batch(body) if topic == bus.BATCH_TOPIC else [body]
        for payload in payloads:
            if type(records.decode(payload)) is records.Step:
                got += 1
        last_t = time.monotonic()
    results.put(("subscriber", last_t, got, 0, 0))
    sock.close(0)
    ctx.term()


def _collect(results, procs) -> dict[str, tuple]:
    out = {}
    while len(out) < 2:
        item = results.get(timeout=IDLE_GIVE_UP_S * 4)
        out[item[0]] = item[1:]
    for proc in procs:
        proc.join(30)
    return out


def through_hub(n: int, batch: int, folder: Path) -> dict:
    from trainmeter_core.bus.hub import Hub
    from trainmeter_core.runlog.recorder import Recorder

    ctx = mp.get_context("spawn")
    run_dir = folder / "run"
    run_dir.mkdir()
    recorder = Recorder(run_dir, reserve_b=0)
    hub = Hub(f"ipc://{folder}/in", f"ipc://{folder}/out", recorder)
    recorder.start()
    hub.start()
    ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    sub = ctx.Process(target=subscriber_main, args=(hub.out_endpoint, n, ready, results))
    prod = ctx.Process(target=producer_main, args=(hub.in_endpoint, n, batch, go, results))
    sub.start()
    prod.start()
    while not ready.wait(0.05):  # a SUB joins late: probe until the subscriber hears one
        hub.inject(records.Notice(topic="bench", message="probe"))
    go.set()
    out = _collect(results, [sub, prod])
    hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=0.0))
    recorder.close()
    start_t, _ = out["producer"]
    last_t, got, gaps, malformed = out["subscriber"]
    return {
        "got": got,
        "gaps": gaps,
        "malformed": malformed + hub.malformed,
        "elapsed_s": (last_t - start_t) if last_t else float("nan"),
        "log_b": recorder.bytes_written,
        "queue_dropped": recorder.queue_dropped,
    }


def baseline(n: int, batch: int, folder: Path) -> dict:
    ctx = mp.get_context("spawn")
    endpoint = f"ipc://{folder}/base"
    ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    pull = ctx.Process(target=pull_main, args=(endpoint, n, ready, results))
    pull.start()
    ready.wait(60)
    prod = ctx.Process(target=producer_main, args=(endpoint, n, batch, go, results))
    prod.start()
    go.set()
    out = _collect(results, [pull, prod])
    start_t, _ = out["producer"]
    last_t, got, _, _ = out["subscriber"]
    return {"got": got, "elapsed_s": (last_t - start_t) if last_t else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--batch", default="1,100", help="records per producer message, comma-separated")
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, {args.records} step records per run, target >= {TARGET_PER_S:,}/s through the hub"
    )
    for batch in (int(b) for b in args.batch.split(",")):
        folder = Path(tempfile.mkdtemp(prefix="tmb", dir="/tmp"))  # ipc paths must stay under 107 bytes
        try:
            (folder / "hub").mkdir()
            (folder / "base").mkdir()
            base = baseline(args.records, batch, folder / "base")
            hub = through_hub(args.records, batch, folder / "hub")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        base_rate = base["got"] / base["elapsed_s"]
        hub_rate = hub["got"] / hub["elapsed_s"]
        label = "single records" if batch == 1 else f"batches of {batch}"
        print(f"\nproducer sends {label}:")
        print(
            f"  baseline PUSH->PULL+decode: {base_rate:10,.0f} records/s  ({base['got']} in {base['elapsed_s']:.2f} s)"
        )
        print(
            f"  through the hub:            {hub_rate:10,.0f} records/s  ({hub['got']} in {hub['elapsed_s']:.2f} s)"
        )
        print(f"  hub / baseline:             {hub_rate / base_rate:10.2f}")
        print(
            f"  subscriber gaps {hub['gaps']}, malformed {hub['malformed']}, recorder queue drops "
            f"{hub['queue_dropped']}, log {hub['log_b'] / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
