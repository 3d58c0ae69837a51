"""The engine: records in hub order, a snapshot with every metric of the spec out on each ``tick`` and at ``run.end``.

Pure and deterministic: no I/O, no clock of its own (time is the ``t`` of ticks and records), no globals; its whole
state serialises, so a restored engine fed the rest of a log gives the same snapshots. It must never show a zero for
an unknown: a metric that lacks an input is absent and names the input, and every FLOPs number carries its convention.
"""

from __future__ import annotations

import math

import msgspec

from trainmeter_core.model import formulas as fm
from trainmeter_core.model import records as rec
from trainmeter_core.model.catalog import canonical, is_explicit_train_key
from trainmeter_core.model.engine import attempts
from trainmeter_core.model.engine import nodes as job_nodes
from trainmeter_core.model.engine import window as win
from trainmeter_core.model.engine.profiles import on_profile_import
from trainmeter_core.model.engine.samples import take_gpu_sample, take_host_sample
from trainmeter_core.model.engine.snapshot import build_snapshot, record_history
from trainmeter_core.model.engine.state import (
    _GPU_FIELDS,
    _LOSS_SERIES,
    _MAX_TOKENS_PER_STEP,
    _NAN,
    HOST_WINDOW_FIELDS,
    NODE_WINDOW_FIELDS,
    STEP_WINDOW,
    EngineState,
    GpuState,
    PendingPoint,
    RankState,
)
from trainmeter_core.model.engine.time_split import take_phase
from trainmeter_core.model.engine.tokens import step_tokens
from trainmeter_core.model.facts import ModelFlops, model_flops, whole
from trainmeter_core.model.history import History, HistoryState
from trainmeter_core.model.rig import Rig, resolve_rig

#: The origin of the train loss the agent reads from the tensor passed to backward(): it loses to any other.
_BACKWARD = "backward"
#: Raw series keys whose canonical name is cached (a log of ever new keys must not grow the cache without bound).
_CANONICAL_CACHED_MAX = 4096
_ALPHA = fm.EMA_ALPHA
_INF = math.inf
_MARKS_KEPT_MAX, _RECENT_MARKS = attempts.MARKS_KEPT_MAX, attempts.RECENT_MARKS

__all__ = ["STEP_WINDOW", "Engine", "EngineState", "GpuState", "RankState", "build_snapshot"]


class _Checkpoint(msgspec.Struct):
    engine: EngineState
    history: HistoryState


_RUN_START = rec.RunStart
_encoder = msgspec.msgpack.Encoder()
_decoders: list[msgspec.msgpack.Decoder] = []  # the checkpoint's, built at the first restore (2.5 ms)


class Engine:
    """Feed it records in hub order; it answers each ``tick`` and the ``run.end`` with a snapshot."""

    def __init__(self, state: EngineState | None = None, history: History | None = None) -> None:
        self.state = state if state is not None else EngineState()
        self.history = history if history is not None else History()  # sets _history and _keeps
        self._derived_version = -1
        self._rig = Rig()
        self._flops = ModelFlops()
        self._declared_tokens_per_step: int | None = None
        self._other_tokens_per_step: int | None = None
        self._dp: int | None = None
        self._fpt_single = _NAN
        self.fact_warnings: list[str] = []
        self._gpu_names: dict[tuple[str, int], tuple[str, tuple[str, ...]]] = {}
        self._quiet = False
        self._t_offset = self.state.resume.t_offset  # read on every record: kept here, as the state holds it
        # canonical(raw_key, seen_explicit_train) by the flag's value: a pure function, cached
        self._canonical_names: tuple[dict[str, str], dict[str, str]] = ({}, {})
        self._handlers = {
            rec.Step: self._on_step,
            rec.Metric: self._on_metric,
            rec.Fact: self._on_fact,
            rec.Phase: self._on_phase,
            rec.SampleGpu: self._on_sample_gpu,
            rec.SampleHost: self._on_sample_host,
            rec.SampleNode: self._on_sample_node,
            rec.Tick: self._on_tick,
            rec.RunStart: self._on_run_start,
            rec.RunEnd: self._on_run_end,
            rec.ProfileImport: self._on_profile_import,
        }

    #: The kinds ``feed`` reads (set below the class, from the handlers and a job's kinds); a reader may pass the others
    #: undecoded.
    FED_KINDS: frozenset[str] = frozenset()

    # ------------------------------------------------------------------------------------------------------------------
    # Public

    @property
    def history(self) -> History:
        """Where the points go. Setting it sets ``_keeps``, the flag the handlers read: a NoHistory keeps none."""
        return self._history

    @history.setter
    def history(self, history: History) -> None:
        self._history, self._keeps = history, history.keeps

    def feed(self, record: rec.Record | rec.Unknown, snapshots: bool = True) -> list[rec.Snapshot]:
        """Take one record; returns the snapshot a ``tick`` or ``run.end`` produces, else an empty list.

        ``snapshots=False`` is for catching up on a log whose snapshots nobody reads: a tick then only updates the
        history (by the same code, so the state ends up identical; with a NoHistory, nothing) and returns nothing.
        """
        self._quiet = not snapshots
        state = self.state
        seq = record.seq
        if seq is not None:
            state.through_seq = seq
        handler = self._handlers.get(type(record))
        if handler is None:
            if isinstance(record, job_nodes.JOB_KINDS):
                job_nodes.arrive(state, record)  # a job's node and clock records: nodes.py reads them
            return []
        if state.nodes:
            record = job_nodes.arrive(state, record)  # a job's record, or another node's on the hub's clock
            if record is None:
                return []
        if type(record) is _RUN_START and record.host not in state.nodes:
            # A second run.start of this run opens its next attempt (tm --resume).
            attempts.start(state, record)
            self._t_offset = state.resume.t_offset
        if self._t_offset:  # an attempt on another clock joins the run's timeline
            record = attempts.shifted(record, self._t_offset)
        if state.start_t is None and not isinstance(record, rec.Fact):
            state.start_t = record.t
        return handler(record)

    def snapshot(self) -> rec.Snapshot:
        """The snapshot of the current state (as the last tick would have it, final once the run ended)."""
        return build_snapshot(self, final=self.state.finished)

    def state_bytes(self) -> bytes:
        """The whole state, history included, as MessagePack: ``Engine.from_state`` resumes from it exactly."""
        return _encoder.encode(_Checkpoint(engine=self.state, history=self._history.to_state()))

    @classmethod
    def from_state(cls, data: bytes) -> Engine:
        """An engine restored from ``state_bytes``; raises msgspec.DecodeError or ValueError on bytes that are not."""
        if not _decoders:
            _decoders.append(msgspec.msgpack.Decoder(_Checkpoint))
        checkpoint = _decoders[0].decode(data)
        return cls(checkpoint.engine, History.from_state(checkpoint.history))

    # ------------------------------------------------------------------------------------------------------------------
    # What the facts imply, recomputed only when a fact changed (derived, so never part of the state)

    def derived(self) -> tuple[Rig, ModelFlops]:
        facts = self.state.facts
        if facts.version != self._derived_version:
            self._derived_version = facts.version
            visible = {host: tuple(entries) for host, entries in self.state.visible_devices.items()}
            self._rig = resolve_rig(facts, visible)
            self._flops = model_flops(facts)
            self.fact_warnings = facts.warnings()
            self._fpt_single = self._flops.value if self._flops.value is not None else _NAN
            declared = facts.get("tokens_per_step")
            tokens = whole(declared.value) if declared is not None else None
            tokens = tokens if tokens is not None and 0 < tokens < _MAX_TOKENS_PER_STEP else None
            is_declared = declared is not None and declared.provenance == "declared"
            self._declared_tokens_per_step = tokens if is_declared else None
            self._other_tokens_per_step = None if is_declared else tokens
            dp = whole(facts.value("dp"))
            self._dp = dp if dp is not None and 1 <= dp < _MAX_TOKENS_PER_STEP else None
        return self._rig, self._flops

    # ------------------------------------------------------------------------------------------------------------------
    # Handlers

    def _x(self) -> tuple[float, float, float]:
        """The step, tokens and FLOPs-spent x values of a point recorded now."""
        state = self.state
        if self._derived_version != state.facts.version:
            self.derived()  # a restored engine derives on first use, so its x values match a continuous one
        step = float(state.last_step) if state.last_step is not None else _NAN
        if state.steps_with_tokens:
            return step, float(state.tokens_seen), state.tokens_seen * self._fpt_single
        return step, _NAN, _NAN

    def _on_step(self, record: rec.Step) -> list[rec.Snapshot]:
        state = self.state
        if state.pending_backward and (record.rank or 0) == 0:
            self._commit_backward(before_step=record.step)  # an earlier iteration is over: its loss stands
        rank_id = record.rank or 0
        rank = state.ranks.get(rank_id)
        if rank is None:
            rank = state.ranks[rank_id] = RankState(host=record.host)
        t = record.t
        profiled = record.profiled
        interval = record.step_time_s
        if interval is None and rank.last_t is not None:
            previous_t = attempts.previous_reading(state, rank.last_t)  # never across a resume's gap
            interval = t - previous_t if previous_t is not None else None
        rank.steps += 1
        rank.last_t = t
        # The host's training window (win.extend_span, inlined: this is the engine's hottest path)
        span = state.step_spans.get(record.host)
        if span is None:
            state.step_spans[record.host] = win.StepSpan(first_t=t, last_t=t)
        elif t > span.last_t:
            if span.gap_from is not None:
                attempts.reopen_span(span, t)
            span.last_t = t
        if interval is not None and not 0.0 < interval < _INF:
            interval = None  # a clock that went backwards (or NaN, or infinite) measures nothing
        if interval is not None and not profiled:
            # fm.ema, inlined (as every EMA and window below: this is the engine's hottest path)
            previous = rank.step_time_ema_s
            rank.step_time_ema_s = (
                float(interval) if previous is None else previous + _ALPHA * (interval - previous)
            )
        if rank_id != 0:
            if interval is not None and self._keeps:
                step, tokens, flops = self._x()
                self._history.add_point(
                    f"tm:rank:{rank_id}:step_time_s", step, tokens, flops, record.wall, interval
                )
            return []
        # Rank 0 is the step clock: steps, tokens and the training window are counted on it alone.
        if self._derived_version != state.facts.version:
            self.derived()
        tokens = step_tokens(
            state, record, self._dp, self._declared_tokens_per_step, self._other_tokens_per_step
        )
        first = state.first_step_t is None
        first_of_attempt = not state.attempt_stepped
        if first_of_attempt:
            state.attempt_stepped = True
            attempts.first_step(state, record)  # closes a resume's join, takes back the steps done again
        previous_step_t = state.last_step_t
        steps = state.steps = state.steps + 1
        state.last_step = record.step
        if first:
            state.first_step_t = t
        elif first_of_attempt:
            pass  # a resumed attempt's first step: its work lies in the join, which the window leaves out
        elif profiled:
            state.profiled_steps += 1
            state.profiled_s += interval if interval is not None else 0.0
        elif tokens is None:
            state.window_steps_without_tokens += 1
        else:
            state.window_tokens += tokens
            if interval is not None:
                previous = state.tokens_ema
                state.tokens_ema = (
                    float(tokens) if previous is None else previous + _ALPHA * (tokens - previous)
                )
                previous = state.interval_ema_s
                state.interval_ema_s = (
                    float(interval) if previous is None else previous + _ALPHA * (interval - previous)
                )
        if not first and not profiled and interval is not None:
            recent = state.recent_intervals_s
            recent.append(interval)
            if len(recent) > STEP_WINDOW:
                del recent[0]
            if tokens is not None:
                recent = state.recent_rates
                recent.append(tokens / interval)
                if len(recent) > STEP_WINDOW:
                    del recent[0]
        state.last_step_t = t
        state.last_step_wall = record.wall
        if tokens is not None:
            tokens_seen = state.tokens_seen = state.tokens_seen + tokens
            with_tokens = state.steps_with_tokens = state.steps_with_tokens + 1
        else:
            tokens_seen, with_tokens = state.tokens_seen, state.steps_with_tokens
        # The mark a resume can rewind to (model/engine/attempts.py; here, because this is the engine's hottest path)
        resume = state.resume
        if first_of_attempt:
            stepping_s = resume.stepping_s
        else:
            stepping_s = resume.stepping_s = resume.stepping_s + (t - previous_step_t)  # type: ignore[operator]
        if resume.phase_after_step_s:
            resume.phase_after_step_s = resume.wait_after_step_s = 0.0
        marks = resume.marks
        marks.append((record.step, t, steps, tokens_seen, with_tokens,
                      stepping_s, resume.stepping_phase_s, resume.stepping_wait_s))  # fmt: skip
        if len(marks) >= _MARKS_KEPT_MAX:
            del marks[:_RECENT_MARKS]  # in one go, now and then: the latest RECENT_MARKS stay
        if state.phase_after_last_s:
            state.phase_after_last_s = {}
        if interval is not None and self._keeps:
            # self._x(), inlined: the facts were derived above
            step = float(state.last_step) if state.last_step is not None else _NAN
            if with_tokens:
                tokens_x, flops = float(tokens_seen), tokens_seen * self._fpt_single
            else:
                tokens_x = flops = _NAN
            self._history.add_point("tm:rank:0:step_time_s", step, tokens_x, flops, record.wall, interval)
        return []

    def _on_metric(self, record: rec.Metric) -> list[rec.Snapshot]:
        state = self.state
        values = record.values
        origin = record.origin
        # The agent's loss from backward() names train_loss itself: it must not turn the loop's bare ``loss`` into
        # a custom series.
        if not state.seen_explicit_train and origin != _BACKWARD:
            for raw_key in values:
                if is_explicit_train_key(raw_key):
                    state.seen_explicit_train = True
                    break
        seen_explicit = state.seen_explicit_train
        from_emit = origin == "emit"
        emit_series = state.emit_series
        keeps = self._keeps
        # A point's x values: for the history, or held with a loss from backward() (they are state then)
        if keeps or origin == _BACKWARD:
            # self._x(), inlined (with the steps, this is the engine's hottest path)
            if self._derived_version != state.facts.version:
                self.derived()
            if record.step is not None:
                step = float(record.step)
            else:
                step = float(state.last_step) if state.last_step is not None else _NAN
            if state.steps_with_tokens:
                tokens, flops = float(state.tokens_seen), state.tokens_seen * self._fpt_single
            else:
                tokens = flops = _NAN
        else:
            step = tokens = flops = _NAN  # read by no one: the history keeps no point
        # canonical() by a cache (derived, never state): with the steps, this is the engine's hottest path.
        names = self._canonical_names[seen_explicit]
        add_point = self._history.add_point
        for raw_key, value in values.items():
            name = names.get(raw_key)
            if name is None:
                name = canonical(raw_key, seen_explicit)
                if len(names) < _CANONICAL_CACHED_MAX:
                    names[raw_key] = name
            # Precedence for one series: emit() > a tapped tracker > the loss the agent read from backward().
            if from_emit:
                if name not in emit_series:
                    emit_series[name] = True
            elif name in emit_series:
                continue  # emit() beats a tapped tracker for the same series
            elif origin == _BACKWARD:
                if name in state.tapped_series:
                    continue  # the loop's own tracker reports this series
                point = rec.SeriesPoint(
                    canonical=name, raw_key=raw_key, value=value, step=record.step, t=record.t
                )
                state.pending_backward[name] = PendingPoint(
                    point=point, x_step=step, x_tokens=tokens, x_flop=flops, wall=record.wall
                )
                continue
            elif name not in state.tapped_series:
                state.tapped_series[name] = True
            if state.pending_backward:
                state.pending_backward.pop(name, None)  # the loop's own value for the iteration wins
            # A series' point into the state and the history (as _commit_backward puts a held one)
            if name == _LOSS_SERIES:
                self._on_loss(value)
            state.series[name] = rec.SeriesPoint(
                canonical=name, raw_key=raw_key, value=value, step=record.step, t=record.t
            )
            if keeps:
                add_point(name, step, tokens, flops, record.wall, value)
        return []

    def _on_loss(self, value: float) -> None:
        state = self.state
        if not state.loss_seen:
            state.loss_seen = True
        if not -_INF < value < _INF:
            state.loss_nonfinite += 1
        elif state.loss_tick_max is None or value > state.loss_tick_max:
            state.loss_tick_max = value

    def _commit_backward(self, before_step: int | None = None) -> None:
        """Into the state and history, as ``_on_metric`` puts a point: the held losses from backward() of iterations
        over (all, or those before ``before_step``: a loop reports its loss after its step, so k ends at step k+1)."""
        state = self.state
        pending = state.pending_backward
        for name, held in list(pending.items()):
            point = held.point
            if before_step is not None and point.step is not None and point.step >= before_step:
                continue
            if point.canonical == _LOSS_SERIES:
                self._on_loss(point.value)
            state.series[point.canonical] = point
            self._history.add_point(
                point.canonical, held.x_step, held.x_tokens, held.x_flop, held.wall, point.value
            )
            del pending[name]

    def _on_fact(self, record: rec.Fact) -> list[rec.Snapshot]:
        self.state.facts.add(record)
        return []

    def _on_phase(self, record: rec.Phase) -> list[rec.Snapshot]:
        take_phase(self.state, record)
        return []

    def _on_sample_gpu(self, record: rec.SampleGpu) -> list[rec.Snapshot]:
        state = self.state
        if "index" in record.absent:
            # The sampler's one row for a node it cannot read at all ("no NVML"): no GPU, so no GPU metric has a value.
            state.gpu_absent = record.absent["index"]
            return []
        names = self._gpu_names.get((record.host, record.index))
        if names is None:
            key = f"{record.host}/gpu{record.index}"
            series = tuple(f"tm:gpu:{key}:{name}" for name, _ in _GPU_FIELDS)
            names = self._gpu_names[(record.host, record.index)] = (key, series)
        key, series = names
        gpu = state.gpus.get(key)
        if gpu is None:
            gpu = state.gpus[key] = GpuState(host=record.host, index=record.index)
        if (
            record.gpm_window_s is not None
            and record.gpm_window_s > 0
            and self._derived_version != state.facts.version
        ):
            self.derived()
        values = take_gpu_sample(state, gpu, record, self._rig.sampled.get(key))
        if self._keeps:
            step, tokens, flops = self._x()
            add = self._history.add_point
            wall = record.wall
            for name, value in zip(series, values, strict=True):
                if value is not None:
                    add(name, step, tokens, flops, wall, value)
        return []

    def _on_sample_host(self, record: rec.SampleHost) -> list[rec.Snapshot]:
        take_host_sample(self.state, record, self.state.host_sample, HOST_WINDOW_FIELDS)
        self.state.host_sample = record
        return []

    def _on_sample_node(self, record: rec.SampleNode) -> list[rec.Snapshot]:
        take_host_sample(self.state, record, self.state.node_sample, NODE_WINDOW_FIELDS)
        self.state.node_sample = record
        return []

    def _on_run_start(self, record: rec.RunStart) -> list[rec.Snapshot]:
        state = self.state
        if job_nodes.own_run_start(state, record) and len(state.attempts) <= 1:
            state.start_t = record.t  # a resumed run's elapsed time runs from its first start
        visible = record.env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            state.visible_devices[record.host] = [
                entry.strip() for entry in visible.split(",") if entry.strip()
            ]
            state.facts.version += 1  # the rig maps CUDA indices through these entries
        return []

    def _on_tick(self, record: rec.Tick) -> list[rec.Snapshot]:
        state = self.state
        state.tick = record.n
        state.now_t = record.t
        state.now_wall = record.wall
        state.child_alive = record.child_alive
        self._commit_backward()
        if not self._quiet or self._keeps:  # a quiet tick's snapshot is for the history alone
            snapshot = build_snapshot(self, final=False, lean=self._quiet)
            record_history(self, snapshot, record.wall)
        state.loss_tick_max = None  # each snapshot shows the largest loss since the one before
        return [] if self._quiet else [snapshot]  # not quiet: built above

    def _on_run_end(self, record: rec.RunEnd) -> list[rec.Snapshot]:
        state = self.state
        state.finished = True
        state.now_t = record.t
        state.now_wall = record.wall
        state.child_alive = False
        state.exit_code, state.exit_signal = record.exit_code, record.signal
        state.exit_signal_name = record.signal_name
        self._commit_backward()
        attempts.end(state, record)
        return [] if self._quiet else [build_snapshot(self, final=True)]

    def _on_profile_import(self, record: rec.ProfileImport) -> list[rec.Snapshot]:
        on_profile_import(self.state.profiles, record)
        # Imported after the run ended (tm import of a finished run): the run's final numbers changed, so say them
        # again, once the trace's last record (the trace itself) is in.
        if self.state.finished and record.scope == "trace" and not self._quiet:
            return [build_snapshot(self, final=True)]
        return []


Engine.FED_KINDS = frozenset(
    kind.__struct_config__.tag for kind in (*Engine()._handlers, *job_nodes.JOB_KINDS)
)  # a job's node and clock records have no handler of their own: ``nodes.arrive`` reads them
