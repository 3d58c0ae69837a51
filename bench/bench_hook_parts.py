"""Where the agent's time goes inside its hooks: issue 16's tight loop in this process (no tm), each attach point
alone, with hooks that do part of what the agent's short way does, and the agent's own short way.

For each attach point (the global optimizer step pre-hook, ``torch.autograd.backward``, the DataLoader iterator's
``__next__``), variants that add one part at a time: a hook that only calls on, then the reads and clocks the records
need, then the agent's bookkeeping, then the agent's own code (``IterationDetector.pre_hook``, the loss probe's
``backward()`` wrapper and the data wait's ``__next__``, each on a stand-in agent that sends nothing: the step's record
is ``bench_agent.py``'s to count). Every variant is timed against no hook in alternating blocks of ``--per-block``
iterations (CPU time of this thread), ``--blocks`` pairs, and the median of the pairs' differences printed with its
quartiles: the same method as ``bench_agent.py --breakdown-only``, whose per-probe figures these parts add up to.

usage: PYTHONPATH=. .venv/bin/python bench/bench_hook_parts.py [--blocks 300] [--per-block 30]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import threading
import time
import weakref

from tight_loop import made_here

import trainmeter_agent._loss as loss_module
from trainmeter_agent._compiling import eager_flag_holder
from trainmeter_agent._iterations import IterationDetector
from trainmeter_agent._loss import LossProbe
from trainmeter_agent._outbox import Outbox
from trainmeter_agent._phases import Phases


class _Iterations:
    """What the loss and data wait hooks read of the agent's iterations: the step, and no timed iteration."""

    iteration = 1
    timed = False
    _agent_s = 0.0


class _Agent:
    """A stand-in for the agent: every gate open, every record accepted and dropped."""

    lean = True
    activated = True
    model = None
    _step_owner = "hooks"

    def __init__(self) -> None:
        self._faults: set[str] = set()
        self.stopped: set[str] = set()
        self.iterations = _Iterations()
        self.outbox = Outbox(lambda batch: None)
        self.outbox.ready = True

    def regate(self) -> None:
        pass

    def send_steady_step(self, *fields) -> bool:
        return True  # taken: the steady step's record is bench_agent.py's to count

    def send_step(self, fields: dict) -> None:
        pass

    def activate(self) -> None:
        pass

    def probe_state(self, probe: str, state: str) -> None:
        pass

    def stop_probe(self, probe: str, exc: BaseException) -> None:
        raise RuntimeError(f"the {probe} probe failed in the bench: {exc!r}") from exc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=300, help="pairs of blocks per variant")
    parser.add_argument("--per-block", type=int, default=30, help="iterations per block")
    args = parser.parse_args()

    import torch

    _, model, optimizer, source = made_here(torch)
    cross_entropy = torch.nn.functional.cross_entropy

    def run(n: int) -> float:
        """µs of this thread's CPU an iteration, over ``n`` iterations."""
        started = time.thread_time_ns()
        for _ in range(n):
            (x,) = next(source)
            optimizer.zero_grad()
            loss = cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            optimizer.step()
        return (time.thread_time_ns() - started) / n / 1e3

    def measure(title: str, variants: dict, install, uninstall, between=None) -> None:
        """Each variant against none, in alternating blocks (the order flips each pair)."""
        print(f"{title} (µs an iteration against none; median of {args.blocks} pairs, quartiles):")
        for name, variant in variants.items():
            differences = []
            for pair in range(args.blocks):
                times = {}
                for on in (True, False) if pair % 2 else (False, True):
                    if on:
                        install(variant)
                    run(5)  # the switch's own iterations (a lane found again, a mark written) are not timed
                    if between is not None:
                        between()
                    times[on] = run(args.per_block)
                    if on:
                        uninstall()
                differences.append(times[True] - times[False])
            q1, median, q3 = statistics.quantiles(differences, n=4)
            print(f"  {name:<78} {median:+6.2f} µs ({q1:+.1f} to {q3:+.1f})", flush=True)

    started = time.perf_counter()
    with open("/proc/loadavg") as f:
        print("load average " + " ".join(f.read().split()[:3]))
    run(300)  # warm: lazy inits, the allocator's pools

    # -- the optimizer step's global pre-hook --------------------------------------------------------------------
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    monotonic = time.monotonic
    marks: dict[int, list] = {}

    def returns(optimizer, args, kwargs):
        return None

    def reads(optimizer, args, kwargs):
        monotonic()
        params = optimizer.param_groups[0]["params"]
        grad = params[0].grad if params else None
        return (
            None if grad._version is None else None
        )  # the version read, and None returned (the step's arguments)

    def reads_and_marks(optimizer, args, kwargs):
        monotonic()
        key = id(optimizer)
        params = optimizer.param_groups[0]["params"]
        grad = params[0].grad if params else None
        mark = marks.get(key)
        if mark is None:
            mark = marks[key] = [weakref.ref(optimizer), weakref.ref(grad), -1]
        if grad is not None and mark[0]() is optimizer:
            version = grad._version
            if mark[1]() is not grad:
                mark[1] = weakref.ref(grad)
            mark[2] = version

    detector = IterationDetector(_Agent())
    detector.attach()  # the lane is found (an optimizer alone in its iterations) and goes without its post-hook
    run(20)
    if detector._lane is None or not detector._postless:
        raise SystemExit("the optimizer hooks did not take their steady lane: nothing to measure")
    detector.detach()
    detector._lane = id(optimizer)  # detach() lets the lane go; the marks stay
    detector._postless = True
    counted = detector.counted
    handle: list = [register_optimizer_step_pre_hook(detector.pre_hook)]
    run(3)
    handle.pop().remove()
    if detector.counted != counted + 3 or detector._post_handle is not None:
        raise SystemExit("the steady lane did not count its iterations alone: nothing to measure")

    def install_hook(hook) -> None:
        handle.append(register_optimizer_step_pre_hook(hook))

    def remove_hook() -> None:
        handle.pop().remove()

    measure(
        "the optimizer step's pre-hook",
        {
            "a hook that returns at once (torch's call of it)": returns,
            "the clock, the first parameter's gradient and its version read": reads,
            "+ the marks (weakrefs to the optimizer and gradient, compared, written)": reads_and_marks,
            "IterationDetector.pre_hook's steady lane (a stand-in agent)": detector.pre_hook,
        },
        install_hook,
        remove_hook,
    )

    # -- backward() ----------------------------------------------------------------------------------------------
    autograd = torch.autograd
    original_backward = autograd.backward

    def passes(*args, **kwargs):
        return original_backward(*args, **kwargs)

    def reads_item(*args, **kwargs):
        result = original_backward(*args, **kwargs)
        args[0].item()
        return result

    depth = [0]

    def counts_depth(*args, **kwargs):
        depth[0] += 1
        try:
            result = original_backward(*args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0]:
            return result
        args[0].item()
        return result

    probe = LossProbe(_Agent())
    probe._torch = torch
    probe._tensor_type = torch.Tensor
    probe._compiler = eager_flag_holder(torch)
    if probe._compiler is None:
        raise SystemExit("this torch has no compile flag the loss probe reads: its short way is never taken")
    probe.fast = True
    wrapper = loss_module._wrap_backward(original_backward, probe)
    autograd.backward = wrapper
    run(3)
    autograd.backward = original_backward
    if probe._entries.__len__() != 3 or probe._why is not None:
        raise SystemExit(f"the loss probe's short way was not taken ({probe._why or len(probe._entries)})")
    measure(
        "torch.autograd.backward wrapped",
        {
            "a wrapper that only calls on (*args, **kwargs)": passes,
            "+ the loss's item()": reads_item,
            "+ the nesting count around the call (a reentrant backward is not the loop's)": counts_depth,
            "the loss probe's wrapper, its short way (a stand-in agent)": wrapper,
        },
        lambda wrapper: setattr(autograd, "backward", wrapper),
        lambda: setattr(autograd, "backward", original_backward),
        between=probe.reset_iteration,  # the losses of a block are never sent: the list starts empty each block
    )

    # -- the DataLoader's __next__ -------------------------------------------------------------------------------
    iter_class = torch.utils.data.dataloader._BaseDataLoaderIter
    original_next = iter_class.__next__
    held = [0.0]

    def next_passes(self):
        return original_next(self)

    def next_clocks(self):
        started = monotonic()
        batch = original_next(self)
        held[0] = monotonic() - started
        return batch

    lock = threading.Lock()

    def next_locked(self):
        started = monotonic()
        batch = original_next(self)
        ended = monotonic()
        lock.acquire()
        held[0] = ended - started
        lock.release()
        return batch

    packed_row = struct.Struct("=ddqB")  # a data wait's row as the outbox packed it before it kept lists
    rows = bytearray(packed_row.size * 1000)
    pack_into = packed_row.pack_into
    starts, ends, labels = [None] * 1000, [None] * 1000, [None] * 1000
    at = [0]

    def next_packed(self):
        started = monotonic()
        batch = original_next(self)
        ended = monotonic()
        lock.acquire()
        row = at[0]
        pack_into(rows, row * 25, started, ended, 7, 1)
        at[0] = (row + 1) % 1000
        lock.release()
        return batch

    def next_listed(self):
        started = monotonic()
        batch = original_next(self)
        ended = monotonic()
        lock.acquire()
        row = at[0]
        starts[row] = started
        ends[row] = ended
        labels[row] = 7
        at[0] = (row + 1) % 1000
        lock.release()
        return batch

    phases = Phases(_Agent())
    phases.attach_data_wait(torch)
    agents_next = iter_class.__next__
    iter_class.__next__ = original_next
    phases.fast = True
    measure(
        "the DataLoader iterator's __next__ wrapped",
        {
            "a wrapper that only calls on": next_passes,
            "+ two clock reads": next_clocks,
            "+ a lock taken and given back": next_locked,
            "+ a row packed into a bytearray (Struct.pack_into), under the lock": next_packed,
            "+ a row stored into three lists instead, under the lock": next_listed,
            "the data wait's wrapper (a row into an Outbox whose windows go nowhere)": agents_next,
        },
        lambda wrapper: setattr(iter_class, "__next__", wrapper),
        lambda: setattr(iter_class, "__next__", original_next),
    )
    windows = phases.agent.outbox.windows
    if not windows:
        raise SystemExit("the data wait's rows never left a window: its short way was not taken")
    print(f"({time.perf_counter() - started:.0f} s; the data wait's Outbox sent {windows} windows)")


if __name__ == "__main__":
    main()
