"""The hub's CPU per record of an agent's window (``[b"window", ...]``, the records built in the hub from the agent's
tuples) against the same records sent as the agent sent them before, a batch of records it built itself
(``[b"batch", ...]``). Both go through the same Hub, recorder and XPUB in this process, alternated; the figure is CPU
time (every thread of the process: the hub's and the recorder's) per record, and the agent's own cost to make each
message beside it. Prints figures; asserts nothing.

Run: ``.venv/bin/python bench/bench_window.py [--windows 200] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainmeter_core.bus.hub import Hub  # noqa: E402
from trainmeter_core.model import (
    agent_batch,  # noqa: E402
    records,  # noqa: E402
)
from trainmeter_core.runlog.recorder import Recorder  # noqa: E402

STEPS_PER_WINDOW = 250  # 50 ms of a ~200 us loop: a steady step (with its loss) and a data wait each


def _window_items(first_step: int) -> list:
    items = []
    for step in range(first_step, first_step + STEPS_PER_WINDOW):
        t = 1000.0 + step * 2e-4
        items.append((agent_batch.BARE_PHASE, "data_wait", t - 5e-5, t - 4e-5, step - 1, "dataloader"))
        items.append(
            (
                agent_batch.STEADY_STEP,
                step,
                t,
                2e-4,
                1,
                20.0,
                1,
                8,
                "input_ids",
                1,
                2.5 + step * 1e-6,
                t,
                "backward",
            )
        )
    return items


def _header() -> dict:
    return {
        "v": records.SCHEMA_VERSION,
        "source": "agent",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "now_t": 1000.0 + 1e6 * 2e-4,
        "now_wall": 1.7e9,
    }


def _as_batch(items: list) -> bytes:
    """The same records as the agent built them before the window: Structs with the header, one batch."""
    header = _header()
    head, raws = agent_batch.split_window(agent_batch.encode_window(header, items))
    return records.encode_many([r for raw in raws for r in agent_batch.expand(raw, head)])


def _feed(hub: Hub, recorder: Recorder, messages: list[tuple[str, bytes]]) -> tuple[float, int]:
    """CPU seconds of this process to take every message in and have the recorder write it all; records taken."""
    before_seq = hub.seq
    started = time.process_time()
    for how, payload in messages:
        if how == "window":
            hub._accept_window(payload)
        else:
            items = records.split_batch(payload)
            checked = records.check_batch(payload)
            for raw, one in zip(items, checked, strict=True):
                hub._accept(raw, checked=one)
        hub.out.flush()
    recorder.flush(timeout_s=120)
    return time.process_time() - started, hub.seq - before_seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--windows", type=int, default=200, help="windows (of 250 steps, 750 records) per round"
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"reproduce: {sys.executable} bench/bench_window.py --windows {args.windows} --rounds {args.rounds}"
    )
    work = tempfile.mkdtemp(dir="/tmp", prefix="tm-bench-window-")
    try:
        (Path(work) / "run").mkdir()
        recorder = Recorder(Path(work) / "run")
        hub = Hub(f"ipc://{work}/in", f"ipc://{work}/out", recorder)
        recorder.start()  # the hub's own thread is not started: this process feeds it, message by message
        items = [_window_items(1 + i * STEPS_PER_WINDOW) for i in range(args.windows)]
        header = _header()
        # What the agent pays to make each message, per record (the window: encode its tuples; the batch: build the
        # records and encode them).
        started = time.process_time()
        windows = [("window", agent_batch.encode_window(header, w)) for w in items]
        window_make_s = time.process_time() - started
        started = time.process_time()
        batches = [("batch", _as_batch(w)) for w in items]
        batch_make_s = time.process_time() - started - window_make_s  # _as_batch encodes a window first
        figures: dict[str, list[float]] = {"window": [], "batch": []}
        logged = 0
        for _ in range(args.rounds):
            for name, messages in (("window", windows), ("batch", batches)):
                cpu_s, logged = _feed(hub, recorder, messages)
                figures[name].append(cpu_s / logged * 1e6)
        recorder.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    w, b = statistics.median(figures["window"]), statistics.median(figures["batch"])
    print(f"records per round: {records} ({args.windows} windows of {STEPS_PER_WINDOW} steps)")
    print(f"hub and recorder, per record: window {w:.2f} us CPU | batch {b:.2f} us CPU | ratio {w / b:.2f}")
    print(
        f"  rounds: window {[round(x, 2) for x in figures['window']]}, batch {[round(x, 2) for x in figures['batch']]}"
    )
    print(
        f"agent, to make the message, per record: window {window_make_s / records * 1e6:.3f} us | "
        f"batch {batch_make_s / records * 1e6:.3f} us (records built from tuples and encoded)"
    )


if __name__ == "__main__":
    main()
