"""The engine: records in hub order in, a snapshot with every metric of the spec out on each ``tick`` and at the
``run.end``; it holds the state, the values the facts imply and the history, and hands each record to its handler.
Pure and deterministic: no I/O, no clock or globals; a restored engine fed the rest of a log makes the same snapshots.

Why one module: what is left here is which handler takes a record, a block's row or a block, in what order, with the
caches the handlers share (series names, canonical keys, the quiet flag); each family's arithmetic is in its own
module (``steps``, ``samples``, ``nodes``, ``block_take``, ``other_rank``). Split, a handler would take the engine's
private caches across a module's edge."""

from __future__ import annotations

import math

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.catalog import canonical, is_explicit_train_key
from trainmeter_core.model.engine import attempts, block_take, collectives, hangs, nodes, other_rank
from trainmeter_core.model.engine.derived import Derived
from trainmeter_core.model.engine.profiles import on_profile_import
from trainmeter_core.model.engine.samples import (
    GPU_FIELDS,
    HOST_WINDOW_FIELDS,
    NODE_WINDOW_FIELDS,
    take_gpu_sample,
    take_host_sample,
)
from trainmeter_core.model.engine.snapshot import build_snapshot, record_history
from trainmeter_core.model.engine.state import EngineState, GpuState, PendingPoint
from trainmeter_core.model.engine.steps import take_step
from trainmeter_core.model.engine.time_split import take_phase
from trainmeter_core.model.history import History, HistoryState

#: The origin of the train loss the agent reads from the tensor passed to backward(): it loses to any other.
_BACKWARD = "backward"
#: The series whose values the loss rules read (non-finite ones counted, the largest of each tick kept).
_LOSS_SERIES = "train_loss"
#: Raw series keys whose canonical name is cached (a log of ever new keys must not grow the cache without bound).
_CANONICAL_CACHED_MAX = 4096
#: The history series of rank 0's step time (every rank has one: ``tm:rank:<rank>:step_time_s``).
_RANK_0_STEP_TIME = "tm:rank:0:step_time_s"
#: The origin of the collective probe's metric records: each rank's go to its own state, never into a series.
_COLLECTIVES = collectives.ORIGIN
_NAN = math.nan
_INF = math.inf


class _Checkpoint(msgspec.Struct):
    """What ``state_bytes`` holds: the state and the history (a map of these two names, no module path)."""

    engine: EngineState
    history: HistoryState


_RUN_START = records.RunStart
_ALERT = records.Alert
_BLOCK = records.Block
_encoder = msgspec.msgpack.Encoder()
_decoders: list[msgspec.msgpack.Decoder] = []  # the checkpoint's, built at the first restore (2.5 ms)


class Engine:
    """Feed it records in hub order; it answers each ``tick`` and the ``run.end`` with a snapshot.

    It never shows a zero for an unknown: a metric that lacks an input is absent and names the input, and every FLOPs
    number carries its convention."""

    def __init__(self, state: EngineState | None = None, history: History | None = None) -> None:
        self.state = state if state is not None else EngineState()
        self.history = history if history is not None else History()  # sets _history and _keeps
        self.derived = Derived(self.state)  # what the facts imply: the families read it too
        self._gpu_names: dict[tuple[str, int], tuple[str, tuple[str, ...]]] = {}
        # Each rank's series of step times by its number (a job's thousands): formatted once
        self._rank_series: dict[int, str] = {}
        self._quiet = False
        self._t_offset = self.state.resume.t_offset  # read on every record: kept here, as the state holds it
        # canonical(raw_key, seen_explicit_train) by the flag's value: a pure function, cached
        self._canonical_names: tuple[dict[str, str], dict[str, str]] = ({}, {})
        self._handlers = {
            records.Step: self._on_step,
            records.Metric: self._on_metric,
            records.Fact: self._on_fact,
            records.Phase: self._on_phase,
            records.SampleGpu: self._on_sample_gpu,
            records.SampleHost: self._on_sample_host,
            records.SampleNode: self._on_sample_node,
            records.Tick: self._on_tick,
            records.RunStart: self._on_run_start,
            records.RunEnd: self._on_run_end,
            records.ProfileImport: self._on_profile_import,
            records.Alert: self._on_alert,
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

    def feed(
        self, record: records.Record | records.Unknown, snapshots: bool = True
    ) -> list[records.Snapshot]:
        """Take one record; returns the snapshot a ``tick`` or ``run.end`` produces, else an empty list. A ``block``
        is taken whole: the state ends as if each of its rows had been fed in order.

        ``snapshots=False`` is for catching up on a log whose snapshots nobody reads: a tick then only updates the
        history (by the same code, so the state ends up identical; with a NoHistory, nothing) and returns nothing.
        """
        self._quiet = not snapshots
        state = self.state
        seq = record.seq
        if seq is not None:
            if state.finished and type(record) is _ALERT:
                return []  # written after run.end from the final snapshot: it changes no number, nor its through_seq
            state.through_seq = seq
        handler = self._handlers.get(type(record))
        if handler is None:
            if type(record) is _BLOCK:
                return self._on_block(record, snapshots)
            if isinstance(record, nodes.JOB_KINDS):
                nodes.arrive(state, record)  # a job's node and clock records: nodes.py reads them
            return []
        if state.nodes:
            record = nodes.arrive(state, record)  # a job's record, or another node's on the hub's clock
            if record is None:
                return []
        if type(record) is _RUN_START and record.host not in state.nodes:
            # A second run.start of this run opens its next attempt (tm --resume).
            attempts.start(state, record)
            self._t_offset = state.resume.t_offset
        if self._t_offset:  # an attempt on another clock joins the run's timeline
            record = attempts.shifted(record, self._t_offset)
        if state.start_t is None and not isinstance(record, records.Fact):
            state.start_t = record.t
        return handler(record)

    def snapshot(self) -> records.Snapshot:
        """The snapshot of the current state (as the last tick would have it, final once the run ended)."""
        return build_snapshot(self.state, self.derived, final=self.state.finished)

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
    # Handlers

    def _on_block(self, block: records.Block, snapshots: bool) -> list[records.Snapshot]:
        """A block's rows, fed in order as if each had come alone (none makes a snapshot); ``through_seq`` ends at its
        last row's. A block whose columns disagree with its rows (none that a hub passed) is passed over whole.

        Rank 0's steady steps, their losses and data waits go in by ``block_take`` without a record built for any;
        every other row by its handler, as ``feed`` would: its records are built then, one letter's at a time
        (``records.block.Letters``), so that a loop that emits a metric every few steps has those metrics built and
        not every row of its blocks (a step's three rows cost about 1 µs to build)."""
        state = self.state
        if not block_take.eligible(state, block) or state.start_t is None:
            return self._on_rows(block, snapshots)
        try:
            records.block.validate(block)
        except records.MalformedRecord:
            return self._on_rows(block, snapshots)
        order, loss = block.order, block.loss
        first_seq = None if block.seq is None else block.seq - block.rows
        end = len(order)
        # Records for the letters that go to their handlers: all of them at once for a block whose first letter
        # does (a state that is not the steady one, which seldom turns steady inside a block), else each as it comes
        # (a third cheaper a row in one go). validate passed: every letter's columns hold its entries, so building
        # cannot fail part of the way through the block.
        built: list[records.Record] | None = None
        letters: records.block.Letters | None = None
        at = s = p = m = r = 0  # the next letter, step, phase, metric and row
        derived, history, keeps = self.derived, self._history, self._keeps
        while at < end:
            if block_take.steady(state, derived, block):
                stop, p_stop, m_stop = block_take.fast_stop(block, at, p, m)
                if stop > at:
                    block_take.take_run(state, derived, history, keeps, block, at, stop, s, p, m)
                    steps = order.count("s", at, stop)
                    r += stop - at + steps - loss[s : s + steps].count(None)
                    s += steps
                    p, m = p_stop, m_stop
                    at = stop
                    if first_seq is not None:
                        state.through_seq = first_seq + r
                    continue
            # One letter's rows by their handlers (a step's loss before it)
            if at == 0:
                built = records.block.expand(block)
            if built is not None:
                rows = built[r : r + (2 if order[at] == "s" and loss[s] is not None else 1)]
            else:
                if letters is None:
                    letters = records.block.Letters(block)
                rows = letters.rows(at, s, p, m, None if first_seq is None else first_seq + r)
            for row in rows:
                if row.seq is not None:
                    state.through_seq = row.seq
                self._handlers[type(row)](row)
            r += len(rows)
            letter = order[at]
            at += 1
            if letter == "s":
                s += 1
            elif letter == "p":
                p += 1
            else:
                m += 1
        return []

    def _on_rows(self, block: records.Block, snapshots: bool) -> list[records.Snapshot]:
        """A block's rows one by one: through ``feed`` for an attempt's on another clock or the run's first; another
        rank's by ``_on_other_rank``; else straight to their handlers (a job's moved onto the hub's clock first)."""
        state = self.state
        if other_rank.takes(state, block):
            try:
                records.block.validate(block)
            except records.MalformedRecord:
                pass  # the rows as expand builds them, or none: as before
            else:
                return self._on_other_rank(block)
        try:
            rows = records.block.expand(block)
        except (IndexError, TypeError, ValueError):
            return []
        if self._t_offset or state.start_t is None:
            # An attempt's rows on another clock, the run's first row: every step of feed.
            feed = self.feed
            for row in rows:
                feed(row, snapshots)
            return []
        # What feed does to a row of a run on the hub's clock that has started, the handler's lookup included (a
        # block's rows are steps, metrics and phases alone): 3% of a block log's replay. A job's rows are first moved
        # onto the hub's clock, all of them at once (``nodes.arrive_rows``: they were built here, so moved in place),
        # and each step marks when its host reported it before its handler takes it, as ``nodes.arrive`` does for a
        # record fed alone.
        job = bool(state.nodes)
        if job:
            host = block.host
            nodes.arrive_rows(state, host, rows)
            mark_step = nodes.mark_step
        on_step, on_metric, on_phase = self._on_step, self._on_metric, self._on_phase
        step_type, metric_type = records.Step, records.Metric
        for row in rows:
            seq = row.seq
            if seq is not None:
                state.through_seq = seq
            cls = type(row)
            if cls is step_type:
                if job:
                    mark_step(state, host, row.rank or 0, row.step, row.t)
                on_step(row)
            elif cls is metric_type:
                on_metric(row)
            else:
                on_phase(row)
        return []

    def _on_other_rank(self, block: records.Block) -> list[records.Snapshot]:
        """A block of a rank that is not the step clock's, from its columns (``other_rank.py``)."""
        series = self._rank_series_name(block.rank or 0)
        other_rank.take(
            self.state,
            self.derived,
            self._history,
            self._keeps,
            block,
            series,
            self._on_step,
            self._on_metric,
        )
        return []

    def _rank_series_name(self, rank_id: int) -> str:
        """A rank's series of step times (``tm:rank:<rank>:step_time_s``), formatted once per rank."""
        series = self._rank_series.get(rank_id)
        if series is None:
            series = self._rank_series[rank_id] = f"tm:rank:{rank_id}:step_time_s"
        return series

    def _on_step(self, record: records.Step) -> list[records.Snapshot]:
        state = self.state
        rank_id = record.rank or 0
        if rank_id == state.clock_rank and state.pending_backward:
            self._commit_backward(before_step=record.step)  # an earlier iteration is over: its loss stands
        interval = take_step(state, record, self.derived)
        if interval is None or not self._keeps:
            return []
        if rank_id != 0 or rank_id != state.clock_rank:
            # Another rank, or the clock of a node of a job without rank 0: the series under its own rank's name.
            step, tokens, flops = self.derived.x()
            self._history.add_point(
                self._rank_series_name(rank_id), step, tokens, flops, record.wall, interval
            )
            return []
        # self.derived.x(), inlined (take_step derived the facts for rank 0), and rank 0's series by its constant
        # name: formatting and hashing a new one would cost each step 0.1 µs.
        step = float(state.last_step) if state.last_step is not None else _NAN
        if state.steps_with_tokens:
            tokens, flops = float(state.tokens_seen), state.tokens_seen * self.derived.x_flop_per_token
        else:
            tokens = flops = _NAN
        self._history.add_point(_RANK_0_STEP_TIME, step, tokens, flops, record.wall, interval)
        return []

    def _on_metric(self, record: records.Metric) -> list[records.Snapshot]:
        state = self.state
        values = record.values
        origin = record.origin
        if origin.startswith(_COLLECTIVES):
            if origin == _COLLECTIVES:
                collectives.take_collectives(state, record)  # every rank's, into its own state: no series
            # A group's own row (``collectives:<group>``: sequence numbers, arrival) stays in the log: no series.
            return []
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
            # self.derived.x(), inlined (with the steps, this is the engine's hottest path)
            derived = self.derived
            if derived.facts_version != state.facts.version:
                derived.refresh()
            if record.step is not None:
                step = float(record.step)
            else:
                step = float(state.last_step) if state.last_step is not None else _NAN
            if state.steps_with_tokens:
                tokens, flops = float(state.tokens_seen), state.tokens_seen * derived.x_flop_per_token
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
                if name in state.tapped_series or not nodes.is_clock(state, record.rank or 0):
                    # The loop's own tracker reports this series; or another rank's own loss (the step clock's rank,
                    # rank 0 or a node's first, makes the run's steps, and so its loss: the others stay in the log).
                    continue
                held = state.pending_backward.get(name)
                if held is not None:
                    # A loss from backward() of a later iteration: the held one's is over, and stands.
                    self._commit_held(held)
                    del state.pending_backward[name]
                point = records.SeriesPoint(
                    canonical=name, raw_key=raw_key, value=value, step=record.step, t=record.t, origin=origin
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
                self._on_loss(value, record.step if record.step is not None else state.last_step)
            state.series[name] = records.SeriesPoint(
                canonical=name, raw_key=raw_key, value=value, step=record.step, t=record.t, origin=origin
            )
            if keeps:
                add_point(name, step, tokens, flops, record.wall, value)
        return []

    def _on_loss(self, value: float, step: int | None) -> None:
        """One train_loss value of the series, at ``step`` (None: unknown)."""
        state = self.state
        if not state.loss_seen:
            state.loss_seen = True
        if not -_INF < value < _INF:
            state.loss_nonfinite += 1
            if state.loss_tick_nonfinite_step is None and step is not None:
                state.loss_tick_nonfinite_step = step  # the first since the previous tick: the alert names it
        elif state.loss_tick_max is None or value > state.loss_tick_max:
            state.loss_tick_max = value

    def _commit_held(self, held: PendingPoint) -> None:
        """A held loss from backward() into the state and the history, as ``_on_metric`` puts a point."""
        point = held.point
        if point.canonical == _LOSS_SERIES:
            x_step = held.x_step
            self._on_loss(point.value, point.step if x_step != x_step else int(x_step))
        self.state.series[point.canonical] = point
        self._history.add_point(
            point.canonical, held.x_step, held.x_tokens, held.x_flop, held.wall, point.value
        )

    def _commit_backward(self, before_step: int | None = None) -> None:
        """The held losses from backward() of iterations over (all, or those before ``before_step``: a loop reports
        its loss after its step, so k ends at step k+1, or at the next loss from backward())."""
        pending = self.state.pending_backward
        for name, held in list(pending.items()):
            step = held.point.step
            if before_step is not None and step is not None and step >= before_step:
                continue
            self._commit_held(held)
            del pending[name]

    def _on_fact(self, record: records.Fact) -> list[records.Snapshot]:
        self.state.facts.add(record)
        return []

    def _on_phase(self, record: records.Phase) -> list[records.Snapshot]:
        take_phase(self.state, record)
        return []

    def _on_sample_gpu(self, record: records.SampleGpu) -> list[records.Snapshot]:
        state = self.state
        if "index" in record.absent:
            # The sampler's one row for a node it cannot read at all ("no NVML"): no GPU, so no GPU metric has a value.
            state.gpu_absent = record.absent["index"]
            return []
        names = self._gpu_names.get((record.host, record.index))
        if names is None:
            key = f"{record.host}/gpu{record.index}"
            series = tuple(f"tm:gpu:{key}:{name}" for name, _ in GPU_FIELDS)
            names = self._gpu_names[(record.host, record.index)] = (key, series)
        key, series = names
        gpu = state.gpus.get(key)
        if gpu is None:
            gpu = state.gpus[key] = GpuState(host=record.host, index=record.index)
        derived = self.derived
        if (
            record.gpm_window_s is not None
            and record.gpm_window_s > 0
            and derived.facts_version != state.facts.version
        ):
            derived.refresh()  # OFU reads the rig's clock basis; without a GPM window, the rig as it was
        values = take_gpu_sample(state, gpu, record, derived, key)
        if self._keeps:
            step, tokens, flops = derived.x()
            add = self._history.add_point
            wall = record.wall
            for name, value in zip(series, values, strict=True):
                if value is not None:
                    add(name, step, tokens, flops, wall, value)
        return []

    def _on_sample_host(self, record: records.SampleHost) -> list[records.Snapshot]:
        take_host_sample(self.state, record, self.state.host_sample, HOST_WINDOW_FIELDS)
        self.state.host_sample = record
        return []

    def _on_sample_node(self, record: records.SampleNode) -> list[records.Snapshot]:
        take_host_sample(self.state, record, self.state.node_sample, NODE_WINDOW_FIELDS)
        self.state.node_sample = record
        return []

    def _on_run_start(self, record: records.RunStart) -> list[records.Snapshot]:
        state = self.state
        if nodes.own_run_start(state, record) and len(state.attempts) <= 1:
            state.start_t = record.t  # a resumed run's elapsed time runs from its first start
        visible = record.env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            state.visible_devices[record.host] = [
                entry.strip() for entry in visible.split(",") if entry.strip()
            ]
            state.facts.version += 1  # the rig maps CUDA indices through these entries
        return []

    def _on_tick(self, record: records.Tick) -> list[records.Snapshot]:
        state = self.state
        state.tick = record.n
        state.now_t = record.t
        state.now_wall = record.wall
        state.child_alive = record.child_alive
        self._commit_backward()
        if not self._quiet or self._keeps:  # a quiet tick's snapshot is for the history alone
            snapshot = build_snapshot(state, self.derived, final=False, lean=self._quiet)
            record_history(self._history, self.derived, snapshot, record.wall)
        state.loss_tick_max = None  # each snapshot shows the largest loss since the one before
        state.loss_tick_nonfinite_step = None  # and the step of the first NaN or infinite one since then
        state.loss_nonfinite_by_tick = state.loss_nonfinite
        return [] if self._quiet else [snapshot]  # not quiet: built above

    def _on_run_end(self, record: records.RunEnd) -> list[records.Snapshot]:
        state = self.state
        state.finished = True
        state.now_t = record.t
        state.now_wall = record.wall
        state.child_alive = False
        state.exit_code, state.exit_signal = record.exit_code, record.signal
        state.exit_signal_name = record.signal_name
        self._commit_backward()
        attempts.end(state, record)
        return [] if self._quiet else [build_snapshot(state, self.derived, final=True)]

    def _on_alert(self, record: records.Alert) -> list[records.Snapshot]:
        hangs.take_alert(self.state, record)  # a hung alert opens the hangs bucket's stall
        return []

    def _on_profile_import(self, record: records.ProfileImport) -> list[records.Snapshot]:
        on_profile_import(self.state.profiles, record)
        # Imported after the run ended (tm import of a finished run): the run's final numbers changed, so say them
        # again, once the trace's last record (the trace itself) is in.
        if self.state.finished and record.scope == "trace" and not self._quiet:
            return [build_snapshot(self.state, self.derived, final=True)]
        return []


Engine.FED_KINDS = frozenset(
    kind.__struct_config__.tag for kind in (*Engine()._handlers, *nodes.JOB_KINDS, _BLOCK)
)  # a job's node and clock records have no handler of their own: ``nodes.arrive`` reads them; a block is fed as its rows
