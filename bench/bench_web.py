"""What the dashboard costs: API latency with 50 concurrent clients, a week-long run's first render and the steady
bytes per second to one open page, and tm's idle CPU and RSS with the web component up and one page open.

Prints figures against their targets; never fails on a time. The server runs in a process of its own, so the clients'
work never sits in its latency. usage: python bench/bench_web.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainmeter_core.model import records  # noqa: E402

WALL0 = 1_700_000_000.0
WEEK_S = 7 * 24 * 3600
WEEK_STEPS = 1_000_000
GPUS = 8


# ----------------------------------------------------------------------------------------------------------------------
# Models to serve


class Joined:
    """The run's engine and the dashboard's state as the bus joins them: each record to both, and what the engine
    publishes (its snapshot, then its history delta) to the model, whose history starts as the engine's."""

    def __init__(self, meta: dict) -> None:
        from trainmeter_core.components.engine import LiveEngine
        from trainmeter_web.dashboard_state import DashboardState

        self.model = DashboardState(meta=meta)
        self.live = LiveEngine()
        self.sync()

    def sync(self) -> None:
        from trainmeter_core.model.history import History

        whole = History.from_state(self.live.history.to_state())
        self.model.load_history(whole, self.live.incarnation, self.live.n)

    def feed(self, record: records.Record) -> None:
        self.model.feed(record)
        for out in self.live.feed(record):
            self.model.feed(out)


def small_model(steps: int) -> Joined:
    """A run of ``steps`` steps with a loss each: its loss history holds exactly ``steps`` raw points."""
    joined = Joined({"run_id": "bench", "name": "bench", "command": ["train.py"]})
    seq = 0
    for step in range(1, steps + 1):
        for record in (
            records.Step(step=step, tokens_global=4096),
            records.Metric(values={"train_loss": 4.0 / step}, step=step),
        ):
            seq += 1
            record.seq, record.t, record.wall = seq, step * 0.1, WALL0 + step * 0.1
            joined.feed(record)
    joined.feed(records.Tick(n=1, interval_s=1.0, seq=seq + 1, t=steps * 0.1, wall=WALL0 + steps * 0.1))
    return joined


def gpu_facts() -> list[records.Record]:
    out: list[records.Record] = [
        records.Fact(name="convention", value="titan", provenance="declared", origin="--convention"),
        records.Fact(name="flop_per_token", value=6.0e9, provenance="declared", origin="--flops-per-token"),
        records.Fact(
            name="budget_tokens",
            value=WEEK_STEPS * 4096 * 1.2,
            provenance="declared",
            origin="--budget-tokens",
        ),
    ]
    for i in range(GPUS):
        out.append(
            records.Fact(
                name="gpu",
                device=f"node/gpu{i}",
                provenance="detected",
                origin="sampler:nvml",
                value={
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "name": "NVIDIA H100 80GB HBM3",
                    "display_name": "H100 SXM",
                    "dense_bf16_flop_per_s": 989e12,
                    "tensor_clock_mhz": 1830.0,
                    "memory_bandwidth_bps": 3.35e12,
                },
            )
        )
        out.append(
            records.Fact(
                name="device",
                rank=i,
                provenance="detected",
                origin="agent",
                value={"type": "cuda", "index": i, "uuid": f"GPU-{i}"},
            )
        )
    return out


def gpu_sample(i: int, k: int) -> records.SampleGpu:
    phase = math.sin(k / 300 + i)
    return records.SampleGpu(
        index=i, uuid=f"GPU-{i}", host="node", util_gpu=0.97, sm_active=0.8 + 0.05 * phase, tensor_active=0.5 + 0.05 * phase,
        dram_active=0.3, clock_sm_mhz=1980.0, power_w=650.0 + 20 * phase, gpm_window_s=1.0,
    )  # fmt: skip


def week_model():
    """A week-long run at 1 Hz with 8 GPUs and a million steps: the engine's state from a short real stream, and a
    history built as a week of points would leave it (one template per cadence, shared by the series of that cadence)."""
    from trainmeter_core.model.history import History, HistoryState
    from trainmeter_core.model.history_sync import JournaledHistory

    joined = Joined({"run_id": "week", "name": "week", "command": ["train.py"], "start_wall": WALL0})
    seq = 0
    t = float(WEEK_S - 120)

    def feed(record: records.Record) -> None:
        nonlocal seq
        seq += 1
        record.seq, record.host = seq, record.host or "node"
        if not record.t:
            record.t, record.wall = t, WALL0 + t
        joined.feed(record)

    for fact in gpu_facts():
        feed(fact)
    step = WEEK_STEPS - 200
    for k in range(120):
        t += 1.0
        for _ in range(1 + k % 2):
            step += 1
            feed(records.Step(step=step, tokens_global=4096, step_time_s=0.6))
            feed(
                records.Metric(
                    values={"train_loss": 2.0 + 1.0 / math.log(step), "lr": 1e-4, "grad_norm": 0.3}, step=step
                )
            )
        for i in range(GPUS):
            feed(gpu_sample(i, k))
        feed(records.Tick(n=k, interval_s=1.0))
    state = joined.live.engine.state
    state.tokens_seen, state.steps_with_tokens, state.steps = step * 4096, step, step
    # The week's history, built once per cadence and shared by name (the bytes are what a real week leaves).
    per_step, per_second = History(), History()
    seconds_per_step = t / step
    for s in range(1, step + 1):
        per_step.add_point(
            "s",
            float(s),
            s * 4096.0,
            s * 4096.0 * 6e9,
            WALL0 + s * seconds_per_step,
            2.0 + 1.0 / math.log(s + 1),
        )
    for k in range(int(t)):
        s = k / seconds_per_step
        per_second.add_point("k", s, s * 4096.0, s * 4096.0 * 6e9, WALL0 + k, 0.5 + 0.05 * math.sin(k / 300))
    step_tiers = per_step.to_state().series["s"]
    second_tiers = per_second.to_state().series["k"]
    history = joined.live.history.to_state()
    names_by_step = ["train_loss", "lr", "grad_norm", *(f"tm:rank:{r}:step_time_s" for r in range(GPUS))]
    names_by_second = [f"tm:{m}" for m in ("tokens_per_s", "step_time_s", "mfu", "ofu", "util_gpu", "sm_active",
                                           "tensor_active", "dram_active", "arithmetic_intensity", "observed_flop",
                                           "goodput")]  # fmt: skip
    names_by_second += [
        f"tm:gpu:node/gpu{i}:{c}"
        for i in range(GPUS)
        for c in ("util_gpu", "sm_active", "tensor_active", "dram_active", "power_w", "clock_sm_mhz")
    ]
    series = {name: step_tiers for name in names_by_step} | {name: second_tiers for name in names_by_second}
    added = {name: WEEK_STEPS for name in names_by_step} | {name: WEEK_S for name in names_by_second}
    week = HistoryState(
        capacity=history.capacity, merge=history.merge, tiers=history.tiers, series=series, added=added
    )
    joined.live.engine.history = joined.live.history = JournaledHistory.from_state(week)
    joined.sync()  # the dashboard takes the engine's whole history, as from its checkpoint
    return joined, seq, t, step


# ----------------------------------------------------------------------------------------------------------------------
# The server process


def serve(sock: socket.socket, which: str, ready, live_hz: float) -> None:
    from trainmeter_web.guard import Guard
    from trainmeter_web.server import Server

    if which == "week":
        joined, seq, t, step = week_model()
    else:
        joined, seq, t, step = small_model(2000), 10**6, 1000.0, 2000
    server = Server(joined.model, sock, Guard("127.0.0.1", None))
    server.start()
    ready.set()
    if not live_hz:
        signal.pause()
    k = 0
    while True:
        # one second of a live run: 1.65 steps on average, every GPU sampled, a tick
        time.sleep(1.0 / live_hz)
        k += 1
        t += 1.0
        logged: list[records.Record] = []
        for _ in range(1 + (k % 3 != 0)):
            step += 1
            logged += [records.Step(step=step, tokens_global=4096, step_time_s=0.6),
                        records.Metric(values={"train_loss": 2.0 + 1.0 / math.log(step), "lr": 1e-4, "grad_norm": 0.3}, step=step)]  # fmt: skip
        if which == "week":
            logged += [gpu_sample(i, k) for i in range(GPUS)]
        logged.append(records.Tick(n=10**6 + k, interval_s=1.0))
        for record in logged:
            seq += 1
            record.seq, record.t, record.wall, record.host = seq, t, WALL0 + t, "node"
            joined.feed(record)
        server.notify()


def start_server(which: str, live_hz: float = 0.0):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=serve, args=(sock, which, ready, live_hz), daemon=True)
    proc.start()
    ready.wait(600)
    return proc, sock.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------------------
# A: API latency


async def latency(port: int, clients: int, requests_each: int) -> dict[str, list[float]]:
    import aiohttp

    paths = {"snapshot": "/api/snapshot", "series": "/api/history?series=train_loss&x=step&points=2000"}
    times: dict[str, list[float]] = {name: [] for name in paths}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector) as session:

        async def client(i: int) -> None:
            for j in range(requests_each):
                name = "snapshot" if (i + j) % 2 else "series"
                start = time.perf_counter()
                async with session.get(paths[name], headers={"Host": f"localhost:{port}"}) as response:
                    body = await response.read()
                times[name].append(time.perf_counter() - start)
                assert response.status == 200, body[:200]

        await asyncio.gather(*(client(i) for i in range(clients)))
    return times


def bench_latency(quick: bool) -> None:
    for live_hz, label in ((0.0, "a still run"), (10.0, "a live run, 10 ticks/s")):
        proc, port = start_server("small", live_hz)
        try:
            times = asyncio.run(latency(port, 50, 20 if quick else 60))
        finally:
            proc.kill()
        for name, values in times.items():
            values.sort()
            p50 = statistics.median(values) * 1000
            p99 = values[int(len(values) * 0.99) - 1] * 1000
            what = "snapshot" if name == "snapshot" else "2,000-point series"
            print(f"API {what:<19} {label:<22}: p50 {p50:6.1f} ms, p99 {p99:6.1f} ms over {len(values)} "
                  "(50 concurrent clients; target p99 <= 20 ms)")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# B: a week-long run


def first_render(port: int) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not os.path.exists("/usr/bin/chromium"):
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(f"GET /api/events HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
            data = b""
            while b"event: state" not in data or not data.rstrip(b"\r\n0").endswith(b"\n\n"):
                data += conn.recv(1 << 20)
        print(f"week-long run: first state event after {time.perf_counter() - start:.2f} s, {len(data) / 1024:.0f} KiB "
              "(no Chromium here: ./scripts/setup-browser for the time to first render)")  # fmt: skip
        return
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        start = time.perf_counter()
        page.goto(f"http://localhost:{port}/")
        page.wait_for_function(
            "() => document.querySelector('#chart-loss') && Number(document.querySelector('#chart-loss').dataset.points) > 0"
            " && document.querySelectorAll('#gpu-charts .chart').length >= 6",
            timeout=60000,
        )
        elapsed = time.perf_counter() - start
        held = page.evaluate("Object.values(document.querySelectorAll('.chart')).length")
        browser.close()
    print(f"week-long run: time to first render {elapsed:.2f} s ({held} charts drawn; target <= 2 s)")


def steady_bytes(port: int, seconds: float) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(f"GET /api/events HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
        data = b""
        while b"event: patch" not in data:  # the first full state, then the first patch: steady from here
            data += conn.recv(1 << 20)
        total = 0
        events = 0
        start = time.monotonic()
        conn.settimeout(1.0)
        while time.monotonic() - start < seconds:
            try:
                chunk = conn.recv(1 << 16)
            except TimeoutError:
                continue
            total += len(chunk)
            events += chunk.count(b"event: patch")
        elapsed = time.monotonic() - start
    print(f"week-long run: {total / elapsed / 1024:.2f} KiB/s to one open page over {elapsed:.0f} s "
          f"({events} patches; target <= 5 KB/s)")  # fmt: skip


def bench_week(quick: bool) -> None:
    started = time.perf_counter()
    proc, port = start_server("week", live_hz=1.0)
    print(
        f"week-long run: model of 1,000,000 steps and 8 GPUs x 604,800 s built in {time.perf_counter() - started:.1f} s"
    )
    try:
        first_render(port)
        steady_bytes(port, 15 if quick else 60)
    finally:
        proc.kill()


# ----------------------------------------------------------------------------------------------------------------------
# C: tm idle with the web component and one page


def drain(conn: socket.socket) -> None:
    """Read a page's stream and drop it, as an open tab does, until the socket closes."""
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def bench_idle(window_s: float) -> None:
    from bench_launcher import TM, cpu_s, env_for, rss_b, tree

    with tempfile.TemporaryDirectory() as tmp:
        env = env_for(Path(tmp) / "runs")
        proc = subprocess.Popen(
            [TM, "--port", "0", "--", sys.executable, "-c", "import time; time.sleep(60)"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        port = None
        for line in proc.stderr:
            match = re.search(r"dashboard http://\S+:(\d+)/", line)
            if match:
                port = int(match.group(1))
                break
        if port is None:
            print(
                "idle run with the dashboard: tm started no dashboard (is the web entry point installed? ./scripts/setup)"
            )
            proc.wait()
            return
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        page = socket.create_connection(("127.0.0.1", port))
        page.sendall(f"GET /api/events HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
        threading.Thread(target=drain, args=(page,), daemon=True).start()
        time.sleep(3.0)  # components started and caught up
        child = [
            p for p in tree(proc.pid) if p != proc.pid and "time.sleep" in open(f"/proc/{p}/cmdline").read()
        ]
        child_tree = set(tree(child[0])) if child else set()
        ours = [p for p in tree(proc.pid) if p not in child_tree]
        web = [p for p in ours if "--process web" in open(f"/proc/{p}/cmdline").read().replace("\0", " ")]
        before = {p: cpu_s(p) for p in ours}
        time.sleep(window_s)
        used = sum(cpu_s(p) - before[p] for p in ours)
        web_used = sum(cpu_s(p) - before[p] for p in web)
        rss = sum(rss_b(p) for p in ours)
        print(
            f"idle run with the dashboard and one page open: tm's {len(ours)} processes use "
            f"{used / window_s * 100:.2f}% of a core (web {web_used / window_s * 100:.2f}%) and {rss / 2**20:.1f} MiB RSS "
            f"(web {sum(rss_b(p) for p in web) / 2**20:.1f} MiB; targets <= 3%, <= 150 MB)"
        )
        page.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests and shorter windows")
    args = parser.parse_args()
    bench_latency(args.quick)
    bench_week(args.quick)
    bench_idle(5.0 if args.quick else 10.0)


if __name__ == "__main__":
    main()
