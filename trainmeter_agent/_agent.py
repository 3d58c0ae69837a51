"""The agent of one training process: the one object every probe calls (send a record, a fact, a phase, stop a probe)
and which owns the process's bus producer and outbox; ``emit()`` (``_emit_calls``) and the step records
(``_step_records``) are its parts in modules of their own, mixed into ``Agent``.

Nothing here may raise into the training process, block it, or touch a device: every entry point catches its own
failure, says so once on stderr (``tm: agent <probe> stopped: ...``) and stops that probe only; zmq and msgspec are
imported on the first record to send, so a process that never reports pays nothing for them.
"""

from __future__ import annotations

import os
import sys
import time

from trainmeter_agent._emit_calls import EmitCalls
from trainmeter_agent._gates import gate_input
from trainmeter_agent._import_watch import ModuleWatcher
from trainmeter_agent._iterations import IterationDetector
from trainmeter_agent._launcher_env import env_int, hello_record, launcher_alive
from trainmeter_agent._loss import ATTACHED as LOSS_ATTACHED
from trainmeter_agent._outbox import MAX_RECORDS as FLUSH_RECORDS
from trainmeter_agent._outbox import START_WINDOWS, Outbox
from trainmeter_agent._step_records import StepRecords, overhead_sums

#: Probe names; ``TM_AGENT_FAULT=<probe>[,<probe>]`` makes each raise an internal error on first use (for tests).
PROBES = ("torch_import", "steps", "grad_scaler", "emit", "bus", "exit")
#: The probes that see inside a model's loop (tests/agent_scripts/gpt_loop.py uses every one).
MODEL_PROBES = ("model", "eval", "data_wait", "checkpoint", "compile", "flops", "loss")
#: The probes of a distributed job (tests/e2e/test_collectives.py runs them under torchrun).
DIST_PROBES = ("collectives",)


class InjectedFault(RuntimeError):
    """The internal error ``TM_AGENT_FAULT`` asks a probe to raise, to prove it cannot reach the training loop."""


class Agent(StepRecords, EmitCalls):
    """Turns what the probes see into records: ``hello`` on the first record, ``step``, ``metric``, ``bye`` at exit."""

    #: The steady iteration's short ways (the optimizer hooks' lane, the data wait's and the step's own). False sends
    #: every iteration the general way: ``tests/e2e/test_agent_depth.py`` runs one loop both ways and compares the records.
    lean = True

    # The states the steady paths' gates are computed from (``_gates.py``); the sets ``stopped`` and ``_faults``
    # change in one place each (``_stop_probe``, ``check_fault``), which regates too.
    activated = gate_input("activated")
    _step_owner = gate_input("_step_owner", "'hooks' or 'emit': whichever sent the first step record")
    model = gate_input("model")
    flops = gate_input("flops")
    loss = gate_input("loss", "the loss passed to backward()")
    phases = gate_input("phases")

    def __init__(self, endpoint: str, *, role: str = "trainer") -> None:
        self._gated = False  # regate() waits for the end of __init__
        self.endpoint = endpoint
        self.role = role
        self.pid = os.getpid()
        self.forked = False  # a fork child of the process that installed the agent
        self.activated = False
        self.producer = None
        self.stopped: set[str] = set()
        self.emit_on = True
        self.bus_on = True
        self._faults = {name for name in os.environ.get("TM_AGENT_FAULT", "").split(",") if name}
        self._warned: set[str] = set()
        self._rec = None  # trainmeter_core.model.records, once activated
        self.iterations = IterationDetector(self)
        self.watcher = ModuleWatcher(self.stop_probe)
        # The probes that hang off torch are built when the user's code imports it, the taps when a tracker is
        # imported: a Python process that does neither pays nothing for them.
        self.model = None
        self.flops = None
        self.loss = None  # the loss passed to backward()
        self.phases = None
        self.collectives = None  # the collective probe (``_collectives.py``), off the steady paths
        self.taps = None
        self.watched_trackers: set[str] = set()  # module names whose import loads the tracker taps
        # torch.compile calls on functions: what runs inside them is hidden from the probes.
        self.compiled_functions = 0
        self._probe_states: dict[str, str] = {}
        self._held: list = []  # facts and phases found before hello: they go out right after it
        # Steps, metrics and phases (as rows of columns until they leave), facts and notices, in call order.
        self.outbox = Outbox(self._send_batch, start_windows=START_WINDOWS)
        self._reset_buffers()
        # The steady step's view of the probes (regate): the model probe while the steady step may take its short way,
        # the loss probe while its loss may leave with the step (else None), and whether the loss probe is on.
        self._steady_model = None
        self._steady_loss = None
        self._loss_on = False
        self._gated = True
        self.regate()

    # -- the steady paths' gates -----------------------------------------------------------------------------------

    def _regate(self) -> None:
        self.regate()

    def regate(self) -> None:
        """Recompute what the hot hooks read instead of the agent's state (``_gates.py``): ``phases.fast``,
        ``model.fast``, ``loss.fast`` and ``iterations.steady``. Each stands for the terms of its short way's condition
        that change rarely; the terms that change within an iteration are still asked there. A gate that is False only
        sends its hook the general way, which sends the same records."""
        if not self._gated:
            return
        model, loss, phases, flops, iterations = (
            self.model,
            self.loss,
            self.phases,
            self.flops,
            self.iterations,
        )
        stopped = self.stopped
        owner = self._step_owner
        quiet = bool(self.lean) and not self._faults
        if phases is not None:
            phases.fast = (
                quiet
                and self.activated
                and phases.data_seen
                and "data_wait" not in stopped
                and owner != "emit"
            )
        # No FLOP count will start: it is over, or this rank never counts (``FlopCount._counting_rank``).
        flops_settled = flops is not None and (flops.done or not flops._counting_rank)
        if model is not None:
            model.fast = quiet and model.on and model.eager and model.seq_len_sent and flops_settled
        if loss is not None:
            loss.fast = quiet and loss.on and loss.eager and owner != "emit"
        steady = (
            quiet
            and owner == "hooks"
            and model is not None
            and "model" not in stopped
            and flops is not None
            and (flops.done or flops._started_step is None)
            and model.root_ref is not None
            and model.dp is not None
        )
        iterations.steady = steady
        self._steady_model = model if steady else None
        self._loss_on = loss is not None and loss.on
        self._steady_loss = loss if steady and self._loss_on and loss._said is LOSS_ATTACHED else None

    def _reset_buffers(self) -> None:
        # The agent's own cost since its last overhead fact (µs, timed steps) and when that fact went out (its step's
        # time), in one array: its doubles are stored in place, so that what a step adds leaves no object behind
        # (tests/e2e/test_agent_steady_alloc.py), whenever the fact (at most once a second) last went out.
        self._overhead = overhead_sums()
        self._step_owner = None
        self._last_emitted_step: int | None = None
        self._last_emitted_step_t: float | None = None
        self._pending_tokens: int | None = None
        self._waiting_step: tuple[int, float, int | None] | None = None  # a declared step the hooks may own

    # -- failures --------------------------------------------------------------------------------------------------

    def check_fault(self, probe: str) -> None:
        """Raise the internal error TM_AGENT_FAULT asked for, once, at the probe's first use."""
        if probe in self._faults:
            self._faults.discard(probe)
            self.regate()
            raise InjectedFault(f"injected by TM_AGENT_FAULT={probe}")

    def say(self, message: str, once_key: str | None = None) -> None:
        """One ``tm:`` line on stderr (once per key). Never raises, even with stderr closed."""
        if once_key is not None:
            if once_key in self._warned:
                return
            self._warned.add(once_key)
        try:
            sys.stderr.write("tm: " + " ".join(message.split())[:400] + "\n")
            sys.stderr.flush()
        except Exception:
            pass

    def stop_probe(self, probe: str, exc: BaseException) -> None:
        """An internal error in one probe: say it once, switch that probe off, tell the run (unless the bus broke)."""
        try:
            self._stop_probe(probe, exc)
        except Exception:  # nothing may escape from the agent's own error path
            pass

    def _stop_probe(self, probe: str, exc: BaseException) -> None:
        if probe in self.stopped:
            return
        self.stopped.add(probe)
        self.regate()
        if probe == "emit":
            self.emit_on = False
        elif probe in ("steps", "torch_import"):
            self.iterations.steps_on = False
        elif probe == "grad_scaler":
            self.iterations.scaler_on = False
        elif probe == "bus":
            self.bus_on = False
            self.emit_on = False
            self.iterations.steps_on = False
        elif probe == "model" and self.model is not None:
            self.model.detach()
        elif probe == "flops" and self.flops is not None:
            self.flops.done = True
        elif probe == "loss" and self.loss is not None:
            self.loss.on = False
        elif probe == "collectives" and self.collectives is not None:
            self.collectives.on = False
        try:
            detail = f"{type(exc).__name__}: {exc}"
        except Exception:
            detail = type(exc).__name__
        message = f"agent {probe} stopped: {detail}"
        self.say(message)
        if probe in MODEL_PROBES or probe in DIST_PROBES or probe.startswith("tap."):
            self.probe_state(probe, "not attached: stopped after an internal error")
        if probe not in ("bus", "exit"):
            try:
                self._send(self._rec_module().Notice(topic=f"agent.{probe}", message=message))
            except Exception as notice_exc:
                self.stop_probe("bus", notice_exc)

    # -- the bus ---------------------------------------------------------------------------------------------------

    def _rec_module(self):
        if self._rec is None:
            from trainmeter_core.model import records

            self._rec = records
        return self._rec

    def activate(self) -> bool:
        """Send ``hello`` (creating the producer if needed); False when the bus cannot be used (said once)."""
        if self.activated:
            return self.bus_on and self.producer is not None
        self.activated = True
        try:
            self.check_fault("bus")
            records = self._rec_module()
            from trainmeter_core.bus.client import Producer

            if self.producer is None:
                self.producer = Producer(self.endpoint, "agent", rank=env_int("RANK"))
            self.producer.send(hello_record(records, self.role))
            held, self._held = self._held, []
            for name, state in self._probe_states.items():
                held.append(self._probe_fact(name, state))
            if held:
                self.producer.send_many(held)
            self.outbox.open_page(self.outbox.max_records)  # the launcher's count of this process's steps
            self.outbox.ready = True
            return True
        except Exception as exc:
            self.stop_probe("bus", exc)
            return False

    def _ready(self) -> bool:
        """Whether records can go out now, activating (hello) on first use."""
        if not self.activated:
            self.activate()
        return self.bus_on and self.producer is not None

    def _send(self, record) -> None:
        """Queue one record after everything queued before it (hello first, if the process has not said it yet)."""
        if self._ready():
            self._queue_record(record, time.monotonic())

    def _queue_metric(self, t: float, values: dict, step: int | None, origin: str) -> None:
        """Queue a metric as a row of the window (its values already real numbers); the first one of a process says
        hello."""
        if not self.activated:
            self.activate()
        self.outbox.put_metric(t, values, step, origin)

    def _queue_record(self, record, now: float) -> None:
        """Queue a whole record, stamped with the producer's header now. It is dated on the wall clock when it was made
        (its ``t``), not when its window leaves: a trace's profiled steps are matched to step records by wall time."""
        if not self.activated:
            self.activate()
        producer = self.producer
        if producer is not None:
            now_t, now_wall = time.monotonic(), time.time()
            if record.t and not record.wall:
                record.wall = now_wall - (now_t - record.t)
            producer.stamp(record, now_t, now_wall)
        self.outbox.put(record, now, steps=1 if type(record) is self._rec_module().Step else 0)

    def flush(self) -> None:
        """Send what is queued as one batch now (a window closes on its own after a second, 50 ms in a process's first
        windows, and at exit and fork)."""
        if self._ready():
            self.outbox.flush()
        elif len(self.outbox):
            self.outbox.discard()  # the bus is gone: what was queued is dropped, never kept to grow

    def _send_batch(self, batch: list) -> None:
        """The outbox's send: one batch message of the window's records, its rows as blocks (the producer stamps each
        with the two clocks read now: a block's rows keep their own times)."""
        if not (self.bus_on and self.producer is not None):
            return
        self.producer.send_many(batch)
        collectives = self.collectives
        if collectives is not None and collectives.on:
            collectives.saw_batch(batch)  # the steps' boundaries, read after they left

    # -- facts, phases, taps ---------------------------------------------------------------------------------------

    def _fact_record(self, name: str, value: object, probe: str, **extra):
        return self._rec_module().Fact(
            name=name, value=value, provenance="detected", origin=f"agent:{probe}", **extra
        )

    def _probe_fact(self, name: str, state: str):
        return self._fact_record(f"probe.{name}", state, "probes")

    def fact(self, name: str, value: object, probe: str, **extra) -> None:
        """A detected fact, queued with the window (or sent right after hello, if the process has not said it yet)."""
        try:
            record = self._fact_record(name, value, probe, **extra)
            if self.activated:
                self._send(record)
            else:
                self._held.append(record)
        except Exception as exc:
            self.stop_probe("bus", exc)

    def probe_state(self, name: str, state: str) -> None:
        """``probe.<name>``: "attached" or "not attached: <reason>", sent when it changes."""
        if self._probe_states.get(name) == state:
            return
        self._probe_states[name] = state
        if self.activated:
            try:
                self._send(self._probe_fact(name, state))
            except Exception as exc:
                self.stop_probe("bus", exc)

    def phase(self, name: str, start_t: float, end_t: float, *, probe: str, **extra) -> None:
        """A span outside plain compute; batched with the metrics (held until hello). A span with no extra field (a
        data wait, once per DataLoader batch) waits as a row of the window's block."""
        step = self.current_step()
        if self.activated and not extra:
            self.outbox.put_phase(name, start_t, end_t, step, probe)
            return
        record = self._rec_module().Phase(
            phase=name, start_t=start_t, end_t=end_t, step=step, probe=probe, t=end_t, **extra
        )
        if not self.activated:
            if (
                len(self._held) < FLUSH_RECORDS
            ):  # a process that never says hello never sends them: keep a few
                self._held.append(record)
            return
        self._queue_record(record, end_t)

    def tapped(self, origin: str, values: dict, step: int | None) -> None:
        """Numbers a tracker tap read, as a metric under the tracker's name."""
        now = time.monotonic()
        self._queue_metric(now, values, step if step is not None else self.current_step(), origin)

    def current_step(self) -> int | None:
        """The step that labels metrics: the loop's own (emit mode) or the agent's iteration count."""
        if self._step_owner == "emit":
            return self._last_emitted_step
        return self.iterations.iteration or None

    # -- process lifetime ------------------------------------------------------------------------------------------

    def after_fork(self) -> None:
        """In a fork child (a DataLoader worker): start from zero, and send nothing unless the child emits."""
        try:
            self.pid = os.getpid()
            self.forked = True
            self.role = "worker"  # a DataLoader worker, or another fork of the trainer
            # The producer stays: it has already given itself a fresh socket and counters for this pid (dropping
            # it here would let the parent's zmq objects be garbage-collected in the child). A child that emits
            # says its own hello first.
            self.activated = False
            self.outbox.after_fork_child()
            self._held = []
            self._probe_states = {}
            self._reset_buffers()
            self.iterations.reset()
            if self.model is not None:
                self.model.reset_iteration()
            if self.flops is not None:
                self.flops.done = True  # the trainer counts; a fork child never does
            if self.loss is not None:
                self.loss.after_fork()
            if self.collectives is not None:
                self.collectives.after_fork()
        except Exception as exc:
            self.stop_probe("exit", exc)

    def at_exit(self) -> None:
        """Flush, and close the producer (``bye``). A process that never reported stays silent.

        Saying hello at exit would import zmq and msgspec and wait for delivery: about 80 ms added to every short
        Python process of a run (a helper script, ``python -c``), for a hello that carries nothing.
        """
        try:
            self.check_fault("exit")
            if os.getpid() != self.pid:
                return
            if not self.activated:
                return  # never imported torch, never emitted: nothing to say
            if not self._ready():
                return
            waiting, self._waiting_step = self._waiting_step, None
            if waiting is not None and self._step_owner is None:
                self._send_emitted_step(
                    *waiting
                )  # a loop that declared one step and never stepped an optimizer
            if self.loss is not None and self.loss.on:
                try:
                    self.loss.poll()  # the copies that have landed by now; one still in flight is not waited for
                except Exception as exc:
                    self.stop_probe("loss", exc)
            collectives = self.collectives
            if collectives is not None and collectives.on:
                self.flush()  # the last steps' records, whose boundaries the probe reads
                try:
                    collectives.at_exit()
                except Exception as exc:
                    self.stop_probe("collectives", exc)
            self.flush()
            # With the launcher gone nobody will read what is queued: exit at once instead of lingering.
            self.producer.close("exit", linger_ms=None if launcher_alive() else 0)
        except Exception as exc:
            self.stop_probe("exit", exc)
