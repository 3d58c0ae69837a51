"""The engine: records in hub order, a snapshot with every metric of the spec out on each ``tick`` and at ``run.end``.

Pure and deterministic: no I/O, no clock of its own (time is the ``t`` of ticks and records), no globals; its whole
state serialises, so a restored engine fed the rest of a log gives the same snapshots. It must never show a zero for
an unknown: a metric that lacks an input is absent and names the input, and every FLOPs number carries its convention.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from trainmeter_core import metrics as fm
from trainmeter_core import records as rec
from trainmeter_core.catalog import canonical, is_explicit_train_key
from trainmeter_core.facts import (
    FactTable,
    ModelFlops,
    Rig,
    RigDevice,
    model_flops,
    number,
    resolve_rig,
    whole,
)
from trainmeter_core.flops import CONVENTIONS
from trainmeter_core.history import History, HistoryState
from trainmeter_core.platform import GPU_LOST

__all__ = ["Engine", "EngineState", "GpuState", "RankState"]

_NAN = math.nan
# Beyond any real batch (2**40 tokens in one step); a larger count is a broken emitter's, and would overflow the sums.
_MAX_TOKENS_PER_STEP = 2**40
# The sample fields the engine uses, with the largest value that makes sense (fractions 0..1, a generous ceiling
# else); each is also kept as history, one line per GPU in the dashboard's GPUs part.
_GPU_FIELDS = (
    ("util_gpu", 1.0),
    ("sm_active", 1.0),
    ("tensor_active", 1.0),
    ("dram_active", 1.0),
    ("power_w", 1e5),
    ("clock_sm_mhz", 1e5),
)
# Alert inputs: how many of rank 0's latest steps the medians look at (odd, so a median is one of them), the clock
# event reasons that mean power or heat (nvml.h: hw_slowdown is either, so it counts as both), the phases during
# which a loop is not training on purpose, and the series whose non-finite values the loss rules count.
STEP_WINDOW = 21
_POWER_REASONS = ("sw_power_cap", "hw_power_brake", "hw_slowdown")
_THERMAL_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown")
_PAUSE_PHASES = ("eval", "checkpoint")
_LOSS_SERIES = "train_loss"
# A GPU whose latest sample is older than this is no longer watched (the sampler narrowed its selection to the run's
# GPUs): its health is absent rather than frozen at its last reading.
_STALE_GPU_S = 30.0


class RankState(msgspec.Struct, kw_only=True):
    """One rank's steps: its count, its step-time EMA and when its last step came (its own host's clock)."""

    host: str = ""
    steps: int = 0
    step_time_ema_s: float | None = None
    last_t: float | None = None


class GpuState(msgspec.Struct, kw_only=True):
    """One GPU's latest sample and what the engine integrates over its samples (energy, OFU × window)."""

    host: str
    index: int
    uuid: str | None = None
    t: float | None = None
    util_gpu: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    clock_sm_mhz: float | None = None
    power_w: float | None = None
    absent: dict[str, str] = {}
    energy_j: float = 0.0
    power_samples: int = 0
    ofu_s: float = 0.0  # Σ OFU × GPM window, for observed FLOPs
    ofu_samples: int = 0
    ofu_missed: int = 0  # samples whose OFU could not be computed (no GPM, no tensor clock yet)
    # for the alert rules: the latest clock event reasons, Xids counted over every sample, ECC, lost
    throttle: list[str] = []
    xid_count: int = 0
    xid_last: int | None = None
    ecc_uncorrected: int | None = None
    lost: bool = False


class EngineState(msgspec.Struct, kw_only=True):
    """Everything the engine knows; a msgspec Struct so a checkpoint is one encode."""

    facts: FactTable = msgspec.field(default_factory=FactTable)
    visible_devices: dict[str, list[str]] = {}  # host -> CUDA_VISIBLE_DEVICES entries from run.start
    start_t: float | None = None
    now_t: float | None = None
    now_wall: float = 0.0
    tick: int = 0
    through_seq: int | None = None
    finished: bool = False
    # the step clock (rank 0, or a single process)
    steps: int = 0
    last_step: int | None = None
    first_step_t: float | None = None
    last_step_t: float | None = None
    tokens_seen: int = 0
    steps_with_tokens: int = 0
    window_tokens: int = 0
    window_steps_without_tokens: int = 0
    profiled_s: float = 0.0
    profiled_steps: int = 0
    tokens_ema: float | None = None
    interval_ema_s: float | None = None
    last_tokens_per_step: int | None = None
    last_tokens_source: str | None = None
    dp_assumed: bool = False
    tokens_mismatch: int | None = (
        None  # the latest detected tokens per step that disagreed with the declared one
    )
    ranks: dict[int, RankState] = {}
    # time split (rank 0's phases, after the first step)
    phase_s: dict[str, float] = {}
    phase_after_last_s: dict[str, float] = {}
    phases_seen: dict[str, int] = {}
    # what the loop reports
    seen_explicit_train: bool = False
    emit_series: dict[str, bool] = {}
    series: dict[str, rec.SeriesPoint] = {}
    # samplers
    gpus: dict[str, GpuState] = {}
    host_sample: rec.SampleHost | None = None
    node_sample: rec.SampleNode | None = None
    # what the alert rules read besides the metrics above (docs/metrics.md, "Alert inputs")
    child_alive: bool | None = None  # from the latest tick; False once the run ended
    recent_intervals_s: list[float] = []  # rank 0's latest STEP_WINDOW step intervals, profiled ones left out
    recent_rates: list[float] = []  # tokens / interval of those steps, where a step had tokens
    pause_phase: str | None = None  # the latest eval or checkpoint span of rank 0, and when it ended
    pause_end_t: float | None = None
    loss_seen: bool = False
    loss_nonfinite: int = 0  # train_loss values that were NaN or infinite, over the run
    loss_tick_max: float | None = None  # the largest finite train_loss since the previous tick
    exit_code: int | None = None
    exit_signal: int | None = None
    exit_signal_name: str | None = None


class _Checkpoint(msgspec.Struct):
    engine: EngineState
    history: HistoryState


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Checkpoint)


class Engine:
    """Feed it records in hub order; it answers each ``tick`` and the ``run.end`` with a snapshot."""

    def __init__(self, state: EngineState | None = None, history: History | None = None) -> None:
        self.state = state if state is not None else EngineState()
        self.history = history if history is not None else History()
        self._derived_version = -1
        self._rig = Rig()
        self._flops = ModelFlops()
        self._declared_tokens_per_step: int | None = None
        self._other_tokens_per_step: int | None = None
        self._dp: int | None = None
        self._fpt_single = _NAN
        self.gpu_numbers: dict[str, tuple[float | None, float | None]] = {}
        self.fact_warnings: list[str] = []
        self._gpu_names: dict[tuple[str, int], tuple[str, tuple[str, ...]]] = {}
        self._quiet = False
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
        }

    # ------------------------------------------------------------------------------------------------------------------
    # Public

    def feed(self, record: rec.Record | rec.Unknown, snapshots: bool = True) -> list[rec.Snapshot]:
        """Take one record; returns the snapshot a ``tick`` or ``run.end`` produces, else an empty list.

        ``snapshots=False`` is for catching up on a log whose snapshots nobody reads: a tick then only updates the
        history (computed by the same code, so the state ends up identical) and returns nothing, at a third of the cost.
        """
        self._quiet = not snapshots
        state = self.state
        seq = record.seq
        if seq is not None:
            state.through_seq = seq
        handler = self._handlers.get(type(record))
        if handler is None:
            return []
        if state.start_t is None and not isinstance(record, rec.Fact):
            state.start_t = record.t
        return handler(record)

    def snapshot(self) -> rec.Snapshot:
        """The snapshot of the current state (as the last tick would have it, final once the run ended)."""
        return build_snapshot(self, final=self.state.finished)

    def state_bytes(self) -> bytes:
        """The whole state, history included, as MessagePack: ``Engine.from_state`` resumes from it exactly."""
        return _encoder.encode(_Checkpoint(engine=self.state, history=self.history.to_state()))

    @classmethod
    def from_state(cls, data: bytes) -> Engine:
        """An engine restored from ``state_bytes``; raises msgspec.DecodeError or ValueError on bytes that are not."""
        checkpoint = _decoder.decode(data)
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
            self.gpu_numbers = _gpu_numbers(facts)
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
        rank_id = record.rank or 0
        rank = state.ranks.get(rank_id)
        if rank is None:
            rank = state.ranks[rank_id] = RankState(host=record.host)
        interval = record.step_time_s
        if interval is None and rank.last_t is not None:
            interval = record.t - rank.last_t
        rank.steps += 1
        rank.last_t = record.t
        if interval is not None and not 0.0 < interval < math.inf:
            interval = None  # a clock that went backwards (or NaN, or infinite) measures nothing
        if interval is not None and not record.profiled:
            rank.step_time_ema_s = fm.ema(rank.step_time_ema_s, interval)
        if rank_id != 0:
            if interval is not None:
                step, tokens, flops = self._x()
                self.history.add_point(
                    f"tm:rank:{rank_id}:step_time_s", step, tokens, flops, record.wall, interval
                )
            return []
        # Rank 0 is the step clock: steps, tokens and the training window are counted on it alone.
        if self._derived_version != state.facts.version:
            self.derived()
        tokens = self._tokens_of(record)
        first = state.first_step_t is None
        state.steps += 1
        state.last_step = record.step
        if first:
            state.first_step_t = record.t
        elif record.profiled:
            state.profiled_steps += 1
            state.profiled_s += interval if interval is not None else 0.0
        elif tokens is None:
            state.window_steps_without_tokens += 1
        else:
            state.window_tokens += tokens
            if interval is not None:
                state.tokens_ema = fm.ema(state.tokens_ema, tokens)
                state.interval_ema_s = fm.ema(state.interval_ema_s, interval)
        if not first and not record.profiled and interval is not None:
            _keep_recent(state.recent_intervals_s, interval)
            if tokens is not None:
                _keep_recent(state.recent_rates, tokens / interval)
        state.last_step_t = record.t
        if tokens is not None:
            state.tokens_seen += tokens
            state.steps_with_tokens += 1
        if state.phase_after_last_s:
            state.phase_after_last_s = {}
        if interval is not None:
            step, tokens_x, flops = self._x()
            self.history.add_point("tm:rank:0:step_time_s", step, tokens_x, flops, record.wall, interval)
        return []

    def _tokens_of(self, record: rec.Step) -> int | None:
        """Tokens in this step across all ranks: declared beats detected (a disagreement is warned about)."""
        state = self.state
        detected = record.tokens_global
        source = "tokens_global"
        state.dp_assumed = False
        if detected is None and record.tokens is not None:
            dp = self._dp if self._dp is not None else record.dp
            state.dp_assumed = dp is None
            detected = record.tokens * (dp if dp is not None else 1)
            source = "tokens × dp" if dp is not None else "tokens × dp (dp assumed 1)"
        if detected is not None and not 0 <= detected < _MAX_TOKENS_PER_STEP:
            detected = None  # a negative or absurd count is no count
        declared = self._declared_tokens_per_step
        if declared is not None:
            state.tokens_mismatch = detected if detected is not None and detected != declared else None
            detected, source = declared, "declared --tokens-per-step"
            state.dp_assumed = False
        elif detected is None and self._other_tokens_per_step is not None:
            detected, source = self._other_tokens_per_step, "tokens_per_step fact"
        if detected is not None:
            state.last_tokens_per_step = detected
            state.last_tokens_source = source
        return detected

    def _on_metric(self, record: rec.Metric) -> list[rec.Snapshot]:
        state = self.state
        values = record.values
        if not state.seen_explicit_train:
            for raw_key in values:
                if is_explicit_train_key(raw_key):
                    state.seen_explicit_train = True
                    break
        from_emit = record.origin == "emit"
        emit_series = state.emit_series
        step, tokens, flops = self._x()
        if record.step is not None:
            step = float(record.step)
        for raw_key, value in values.items():
            name = canonical(raw_key, state.seen_explicit_train)
            if from_emit:
                if name not in emit_series:
                    emit_series[name] = True
            elif name in emit_series:
                continue  # emit() beats a tapped tracker for the same series
            if name == _LOSS_SERIES:
                self._on_loss(value)
            state.series[name] = rec.SeriesPoint(
                canonical=name, raw_key=raw_key, value=value, step=record.step, t=record.t
            )
            self.history.add_point(name, step, tokens, flops, record.wall, value)
        return []

    def _on_loss(self, value: float) -> None:
        state = self.state
        state.loss_seen = True
        if not -math.inf < value < math.inf:
            state.loss_nonfinite += 1
        elif state.loss_tick_max is None or value > state.loss_tick_max:
            state.loss_tick_max = value

    def _on_fact(self, record: rec.Fact) -> list[rec.Snapshot]:
        self.state.facts.add(record)
        return []

    def _on_phase(self, record: rec.Phase) -> list[rec.Snapshot]:
        if record.rank not in (None, 0):
            return []  # every rank waits alike; rank 0's phases split the step clock's time
        state = self.state
        name = record.phase
        state.phases_seen[name] = state.phases_seen.get(name, 0) + 1
        if not -math.inf < record.start_t <= record.end_t < math.inf:
            return []  # a span that ends before it starts (or is not finite) holds no time
        if name in _PAUSE_PHASES and (state.pause_end_t is None or record.end_t >= state.pause_end_t):
            state.pause_phase, state.pause_end_t = name, record.end_t
        first = state.first_step_t
        if first is None or record.end_t <= first:
            return []  # before the first step everything is startup and compile
        start = max(record.start_t, first)
        state.phase_s[name] = state.phase_s.get(name, 0.0) + (record.end_t - start)
        last = state.last_step_t
        if last is not None and record.end_t > last:
            after = record.end_t - max(start, last)
            state.phase_after_last_s[name] = state.phase_after_last_s.get(name, 0.0) + after
        return []

    def _on_sample_gpu(self, record: rec.SampleGpu) -> list[rec.Snapshot]:
        state = self.state
        names = self._gpu_names.get((record.host, record.index))
        if names is None:
            key = f"{record.host}/gpu{record.index}"
            series = tuple(f"tm:gpu:{key}:{name}" for name, _ in _GPU_FIELDS)
            names = self._gpu_names[(record.host, record.index)] = (key, series)
        key, series = names
        gpu = state.gpus.get(key)
        if gpu is None:
            gpu = state.gpus[key] = GpuState(host=record.host, index=record.index)
        absent = record.absent
        values: list[float | None] = []
        for name, upper in _GPU_FIELDS:
            value = getattr(record, name)
            # A reading outside its range is a sampler bug: shown absent with the reading, never used as a number.
            if value is not None and not (0.0 <= value <= upper):
                absent = dict(absent) if absent is record.absent else absent
                absent[name] = f"{name} {value!r} from the sampler is outside 0..{upper:g}"
                value = None
            values.append(value)
        util_gpu, sm_active, tensor_active, dram_active, power_w, clock_sm_mhz = values
        if power_w is not None and gpu.t is not None and record.t > gpu.t:
            gpu.energy_j += power_w * (record.t - gpu.t)
            gpu.power_samples += 1
        gpu.uuid = record.uuid
        gpu.t = record.t
        gpu.util_gpu = util_gpu
        gpu.sm_active = sm_active
        gpu.tensor_active = tensor_active
        gpu.dram_active = dram_active
        gpu.clock_sm_mhz = clock_sm_mhz
        gpu.power_w = power_w
        gpu.absent = absent
        gpu.throttle = record.throttle
        if record.xid:
            gpu.xid_count += len(record.xid)
            gpu.xid_last = record.xid[-1]
        gpu.ecc_uncorrected = record.ecc_uncorrected
        gpu.lost = GPU_LOST in absent.values()
        window_s = record.gpm_window_s
        if window_s is not None and window_s > 0:
            if self._derived_version != state.facts.version:
                self.derived()
            clock = self.gpu_numbers.get(key, (None, None))[0]
            if tensor_active is not None and clock_sm_mhz is not None and clock is not None:
                gpu.ofu_s += fm.ofu(tensor_active, clock_sm_mhz, clock) * window_s
                gpu.ofu_samples += 1
            else:
                gpu.ofu_missed += 1
        step, tokens, flops = self._x()
        add = self.history.add_point
        wall = record.wall
        for name, value in zip(series, values, strict=True):
            if value is not None:
                add(name, step, tokens, flops, wall, value)
        return []

    def _on_sample_host(self, record: rec.SampleHost) -> list[rec.Snapshot]:
        self.state.host_sample = record
        return []

    def _on_sample_node(self, record: rec.SampleNode) -> list[rec.Snapshot]:
        self.state.node_sample = record
        return []

    def _on_run_start(self, record: rec.RunStart) -> list[rec.Snapshot]:
        state = self.state
        state.start_t = record.t
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
        snapshot = build_snapshot(self, final=False, lean=self._quiet)
        self._record_history(snapshot, record.wall)
        state.loss_tick_max = None  # each snapshot shows the largest loss since the one before
        return [] if self._quiet else [snapshot]

    def _on_run_end(self, record: rec.RunEnd) -> list[rec.Snapshot]:
        state = self.state
        state.finished = True
        state.now_t = record.t
        state.now_wall = record.wall
        state.child_alive = False
        state.exit_code, state.exit_signal = record.exit_code, record.signal
        state.exit_signal_name = record.signal_name
        return [] if self._quiet else [build_snapshot(self, final=True)]

    def _record_history(self, snapshot: rec.Snapshot, wall: float) -> None:
        """The derived numbers over time, once a tick: a range is kept as its two ends."""
        step, tokens, flops = self._x()
        add = self.history.add_point
        for key in _HISTORY_METRICS:
            value = snapshot.metrics.get(key)
            if value is None:
                continue
            if value.value is not None:
                add(f"tm:{key}", step, tokens, flops, wall, value.value)
            elif value.low is not None and value.high is not None:
                add(f"tm:{key}.low", step, tokens, flops, wall, value.low)
                add(f"tm:{key}.high", step, tokens, flops, wall, value.high)


_HISTORY_METRICS = (
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "ofu",
    "util_gpu",
    "sm_active",
    "tensor_active",
    "dram_active",
    "arithmetic_intensity",
    "observed_flops",
    "goodput",
)


# ----------------------------------------------------------------------------------------------------------------------
# The snapshot

_NO_STEP = "no training step yet"
_NO_TOKENS = "tokens per step unknown: pass --tokens-per-step"
_NO_BUDGET = "budget not declared: pass --budget-tokens"
_EI = rec.ExplainInput


class _Snapshot:
    """Builds one snapshot: every metric a MetricValue with its Explain, or absent naming the missing input."""

    def __init__(self, engine: Engine, final: bool, lean: bool = False) -> None:
        self.lean = lean
        self.state = engine.state
        self.rig, self.flops = engine.derived()
        self.gpu_numbers = engine.gpu_numbers
        self.final = final
        self.metrics: dict[str, rec.MetricValue] = {}
        self.explain: dict[str, rec.Explain] = {}
        self.tps: float | None = None
        self.tps_absent = _NO_STEP
        self.mfu: tuple[float, float] | None = None  # (low, high); equal ends when a convention is chosen
        self.dram_active: float | None = None
        self.eta_s: float | None = None
        self.elapsed_s: float | None = None

    def put(
        self,
        key: str,
        formula: str,
        *,
        absent: str | None = None,
        inputs: dict[str, rec.ExplainInput] | None = None,
        note: str | None = None,
        **fields: Any,
    ) -> None:
        if absent is None and not _finite(fields.get("value"), fields.get("low"), fields.get("high")):
            # An input far outside its range (a count of 1e300) must not show as inf or NaN.
            absent = f"not a finite number: an input is out of range ({formula})"
        if absent is not None:
            fields = {k: v for k, v in fields.items() if k in ("unit", "convention", "label")}
            fields["absent"] = absent
        self.metrics[key] = rec.MetricValue(**fields)
        if not self.lean:
            self.explain[key] = rec.Explain(formula=formula, inputs=inputs or {}, note=note)

    def fpt_ends(self) -> tuple[float, float] | None:
        flops = self.flops
        if flops.value is not None:
            return flops.value, flops.value
        if flops.low is not None and flops.high is not None:
            return flops.low, flops.high
        return None

    def put_scaled(self, key: str, formula: str, factor: float, unit: str, **extra: Any) -> None:
        """FLOPs per token × ``factor``: one value under a convention, else a range over the conventions."""
        ends = self.fpt_ends()
        conv = self.flops.convention
        if ends is None:
            self.put(key, formula, absent=self.flops.absent, unit=unit, **extra)
        elif conv is not None:
            self.put(key, formula, value=ends[0] * factor, unit=unit, convention=conv, **extra)
        else:
            note = "no convention chosen (pass --convention): the range over the conventions"
            self.put(key, formula, low=ends[0] * factor, high=ends[1] * factor, unit=unit, note=note, **extra)

    def throughput(self) -> None:
        state = self.state
        rank0 = state.ranks.get(0)
        alpha = fm.EMA_ALPHA
        one_step = "one step so far: a rate needs two"
        if rank0 is not None and rank0.step_time_ema_s is not None:
            self.put(
                "step_time_s",
                f"EMA of rank 0's seconds per step, alpha {alpha}",
                value=rank0.step_time_ema_s,
                unit="s",
                label="ema",
                inputs={"steps": _EI(value=state.steps, source="rank 0 step records")},
            )
        else:
            self.put(
                "step_time_s",
                "EMA of rank 0's seconds per step",
                absent=one_step if state.steps else _NO_STEP,
            )
        formula = f"EMA(tokens per step) / EMA(step interval), alpha {alpha}, rank 0's steps, profiled ones left out"
        if state.tokens_ema is not None and state.interval_ema_s:
            self.tps = fm.rate_per_s(state.tokens_ema, state.interval_ema_s)
            note = "dp unknown: tokens × dp assumed dp = 1 (pass --dp)" if state.dp_assumed else None
            self.put(
                "tokens_per_s",
                formula,
                value=self.tps,
                unit="tokens/s",
                label="ema",
                note=note,
                inputs={
                    "tokens_per_step": _EI(
                        value=state.last_tokens_per_step, unit="tokens", source=state.last_tokens_source
                    ),
                    "tokens_per_step_ema": _EI(value=state.tokens_ema, unit="tokens"),
                    "step_interval_ema_s": _EI(value=state.interval_ema_s, unit="s"),
                },
            )
        else:
            self.tps_absent = (
                _NO_STEP if not state.steps else (_NO_TOKENS if not state.steps_with_tokens else one_step)
            )
            self.put("tokens_per_s", formula, absent=self.tps_absent, unit="tokens/s")
        if state.steps_with_tokens:
            missing = state.steps - state.steps_with_tokens
            note = f"{missing} steps without a token count are not included" if missing else None
            self.put(
                "tokens",
                "Σ tokens per step over rank 0's steps",
                value=float(state.tokens_seen),
                unit="tokens",
                note=note,
                inputs={"steps": _EI(value=state.steps_with_tokens, source=state.last_tokens_source)},
            )
        else:
            self.put(
                "tokens", "Σ tokens per step", absent=_NO_TOKENS if state.steps else _NO_STEP, unit="tokens"
            )

    def flops_per_token(self) -> None:
        flops = self.flops
        shape_inputs = {k: v for k, v in flops.inputs.items() if k not in ("convention", "flops_per_token")}
        for name, value in flops.per_convention.items():
            formula = CONVENTIONS[name].formula
            if value is None:
                self.put(
                    f"flops_per_token.{name}",
                    formula,
                    absent=flops.reasons[name],
                    unit="FLOP/token",
                    convention=name,
                    inputs=shape_inputs,
                )
            else:
                self.put(
                    f"flops_per_token.{name}",
                    formula,
                    value=float(value),
                    unit="FLOP/token",
                    convention=name,
                    inputs=shape_inputs,
                )
        counted = self.state.facts.get("counted_flops_per_token")
        counted_value = number(counted.value) if counted is not None else None
        formula = "executed FLOPs of one real step (FlopCounterMode, recompute included) / its tokens"
        if counted is not None and counted_value is not None:
            self.put(
                "flops_per_token.counted",
                formula,
                value=counted_value,
                unit="FLOP/token",
                convention="counted",
                label="counted",
                note="shown beside MFU, never in place of a named convention",
                inputs={"counted": _EI(value=counted_value, unit="FLOP/token", source=_fact_source(counted))},
            )
        else:
            self.put(
                "flops_per_token.counted",
                formula,
                absent="no step was counted with FlopCounterMode",
                unit="FLOP/token",
                convention="counted",
            )
        conv = flops.convention
        formula = CONVENTIONS[conv].formula if conv in CONVENTIONS else "the declared FLOPs per token"
        if conv is None:
            formula = "the range over the four conventions"
        self.put_scaled("flops_per_token", formula, 1.0, "FLOP/token", inputs=dict(flops.inputs))
        if self.flops.note:
            self.explain["flops_per_token"].note = self.flops.note

    def budget(self) -> None:
        state = self.state
        facts = state.facts
        tokens_known = bool(state.steps_with_tokens)
        if tokens_known:
            self.put_scaled(
                "flops_spent",
                "FLOPs per token × tokens seen",
                float(state.tokens_seen),
                "FLOP",
                inputs={"tokens": _EI(value=state.tokens_seen, unit="tokens")},
            )
        else:
            self.put(
                "flops_spent",
                "FLOPs per token × tokens seen",
                absent=_NO_TOKENS if state.steps else _NO_STEP,
                unit="FLOP",
            )
        budget_tokens = _positive(facts.value("budget_tokens"))
        budget_steps = _positive(facts.value("budget_steps"))
        budget_flops = _positive(facts.value("budget_flops"))
        budget_inputs = {
            name: _EI(value=facts.value(name), source=_fact_source(facts.get(name)))
            for name in ("budget_tokens", "budget_steps", "budget_flops")
            if facts.get(name) is not None
        }
        if budget_tokens:
            self.put_scaled(
                "flops_required",
                "FLOPs per token × token budget",
                budget_tokens,
                "FLOP",
                inputs=budget_inputs,
            )
        elif budget_flops:
            self.put(
                "flops_required",
                "the declared FLOPs budget",
                value=budget_flops,
                unit="FLOP",
                convention=self.flops.convention or "declared",
                label="declared",
                inputs=budget_inputs,
            )
        else:
            self.put("flops_required", "FLOPs per token × token budget", absent=_NO_BUDGET, unit="FLOP")
        progress = eta = None
        absent = _NO_BUDGET
        eta_absent = self.tps_absent  # what the ETA lacks once progress is known
        if budget_tokens:
            formula = "tokens seen / token budget; ETA = remaining tokens / tokens per s"
            if tokens_known:
                progress = fm.progress(state.tokens_seen, budget_tokens)
                if self.tps:
                    eta = fm.eta_s(budget_tokens - state.tokens_seen, self.tps)
            absent = _NO_TOKENS if state.steps else _NO_STEP
        elif budget_steps:
            formula = "steps / step budget; ETA = remaining steps × step time"
            progress = fm.progress(state.steps, budget_steps)
            step_time = state.ranks[0].step_time_ema_s if 0 in state.ranks else None
            if step_time:
                eta = fm.eta_s(budget_steps - state.steps, 1.0 / step_time)
            absent = _NO_STEP
            eta_absent = "one step so far: a step time needs two"
        elif budget_flops:
            formula = "FLOPs spent / FLOPs budget; ETA = remaining FLOPs / (FLOPs per token × tokens per s)"
            fpt = self.flops.value
            if fpt is not None and tokens_known:
                progress = fm.progress(fpt * state.tokens_seen, budget_flops)
                if self.tps:
                    eta = fm.eta_s(budget_flops - fpt * state.tokens_seen, fpt * self.tps)
            absent = self.flops.absent or "a FLOPs budget needs one FLOPs per token: pass --convention"
            if fpt is not None:
                absent = _NO_TOKENS if state.steps else _NO_STEP
        else:
            formula = "tokens seen / token budget; ETA = remaining tokens / tokens per s"
        if progress is not None:
            self.put("progress", formula, value=progress, inputs=budget_inputs)
        else:
            self.put("progress", formula, absent=absent)
        if eta is not None:
            self.eta_s = eta
            self.put("eta_s", formula, value=eta, unit="s", inputs=budget_inputs)
        else:
            self.put("eta_s", formula, absent=absent if progress is None else eta_absent, unit="s")

    def mfu_metrics(self) -> None:
        state = self.state
        rig = self.rig
        peak_total = rig.peak_total_flops
        ends = self.fpt_ends()
        conv = self.flops.convention
        label = rig.peak_kind
        inputs = _peak_inputs(rig)
        inputs.update(self.flops.inputs)
        notes = list(rig.notes)
        base: list[str] = []
        if peak_total is None:
            base.append(str(rig.peak_absent))
        if ends is None:
            base.append(str(self.flops.absent))
        formula = "FLOPs per token × tokens per s (EMA over steps) / (Σ dense peak of the run's devices)"
        reasons = base + ([self.tps_absent] if self.tps is None else [])
        if reasons:
            self.put("mfu", formula, absent="; ".join(reasons), convention=conv, label=label, inputs=inputs)
        else:
            assert ends is not None and peak_total is not None and self.tps is not None
            inputs["tokens_per_s"] = _EI(value=self.tps, unit="tokens/s", source=f"EMA, alpha {fm.EMA_ALPHA}")
            low = fm.mfu(ends[0], self.tps, peak_total)
            high = fm.mfu(ends[1], self.tps, peak_total)
            self.mfu = (low, high)
            if conv is not None:
                self.put(
                    "mfu", formula, value=low, convention=conv, label=label, inputs=inputs, note=_join(notes)
                )
            else:
                notes.insert(0, "no convention chosen (pass --convention): the range over the conventions")
                self.put("mfu", formula, low=low, high=high, label=label, inputs=inputs, note=_join(notes))
        formula = "FLOPs per token × tokens in the training window / (Σ dense peak × window seconds)"
        window = None
        if state.first_step_t is not None and state.last_step_t is not None:
            window = state.last_step_t - state.first_step_t - state.profiled_s
        reasons = list(base)
        if state.steps < 2:
            reasons.append("the training window needs two steps")
        elif state.window_steps_without_tokens:
            reasons.append(_NO_TOKENS)
        elif window is None or window <= 0 or state.window_tokens <= 0:
            reasons.append("the training window holds no time or no tokens")
        window_fields = {"window_start_t": state.first_step_t, "window_end_t": state.last_step_t}
        if reasons:
            self.put("mfu_avg", formula, absent="; ".join(reasons), convention=conv, label=label)
            return
        assert ends is not None and peak_total is not None and window is not None
        window_inputs = {k: v for k, v in inputs.items() if k != "tokens_per_s"}
        window_inputs["window_tokens"] = _EI(
            value=state.window_tokens, unit="tokens", source="rank 0 steps after the first"
        )
        window_inputs["window_s"] = _EI(
            value=window, unit="s", source="first to last step, profiled steps left out"
        )
        low = fm.mfu_window_average(ends[0], state.window_tokens, window, peak_total)
        high = fm.mfu_window_average(ends[1], state.window_tokens, window, peak_total)
        if conv is not None:
            self.put(
                "mfu_avg",
                formula,
                value=low,
                convention=conv,
                label=label,
                inputs=window_inputs,
                **window_fields,
            )
        else:
            self.put(
                "mfu_avg",
                formula,
                low=low,
                high=high,
                label=label,
                inputs=window_inputs,
                **window_fields,
                note="no convention chosen (pass --convention): the range over the conventions",
            )

    def counter_gpus(self) -> tuple[list[str], str | None]:
        """The sampled GPUs counter metrics average over, or none and why."""
        rig = self.rig
        if rig.absent:
            if not self.state.gpus:
                return [], "no GPU sample yet"
            return sorted(self.state.gpus), None
        if not rig.gpus:
            return (
                [],
                "the run's devices are not sampled GPUs (a CPU run is never scored against the node's GPUs)",
            )
        return [str(d.gpu_key) for d in rig.gpus], None

    def counters(self) -> None:
        state = self.state
        keys, why = self.counter_gpus()
        scope = (
            "the GPUs the ranks reported"
            if not self.rig.absent
            else "every sampled GPU (no rank reported its device)"
        )
        latest: list[GpuState] = []
        for key in keys:
            gpu = state.gpus.get(key)
            if gpu is None:
                why = why or f"no sample from {key} yet"
            else:
                latest.append(gpu)
        for name in ("util_gpu", "sm_active", "tensor_active", "dram_active"):
            formula = f"mean of the latest {name} over {scope}"
            values, reason = _per_gpu(latest, name, why)
            if reason is None:
                mean = fm.mean(values)
                if name == "dram_active":
                    self.dram_active = mean
                # Per-GPU values are the dashboard's GPUs part (history); the explain says what was averaged.
                inputs = {"gpus": _EI(value=len(values), source=", ".join(keys))}
                self.put(name, formula, value=mean, label="counters", inputs=inputs)
            else:
                self.put(name, formula, absent=reason, label="counters")
        formula = "tensor active × min(SM clock, tensor clock) / tensor clock, per GPU, averaged over the run's GPUs"
        reason = why
        ofus: list[float] = []
        ofu_inputs: dict[str, rec.ExplainInput] = {}
        for gpu in latest if why is None else []:
            key = f"{gpu.host}/gpu{gpu.index}"
            clock = self.gpu_numbers.get(key, (None, None))[0]
            if gpu.tensor_active is None:
                reason = gpu.absent.get("tensor_active") or f"no tensor-pipe counter (GPM) from {key}"
            elif gpu.clock_sm_mhz is None:
                reason = gpu.absent.get("clock_sm_mhz") or f"no SM clock from {key}"
            elif clock is None:
                reason = f"the spec of {key} gives no tensor clock, so OFU cannot be scaled"
            if reason is not None:
                break
            ofus.append(fm.ofu(gpu.tensor_active, gpu.clock_sm_mhz, clock))  # type: ignore[arg-type]
            ofu_inputs[key] = _EI(value=ofus[-1], source="sample.gpu")
            ofu_inputs[f"{key} tensor_active"] = _EI(value=gpu.tensor_active, source="sample.gpu (GPM)")
            ofu_inputs[f"{key} clock_sm_mhz"] = _EI(value=gpu.clock_sm_mhz, unit="MHz", source="sample.gpu")
            ofu_inputs[f"{key} tensor_clock_mhz"] = _EI(value=clock, unit="MHz", source="device spec")
        ofu = None
        if reason is None and ofus:
            ofu = fm.mean(ofus)
            self.put(
                "ofu",
                formula,
                value=ofu,
                label="counters",
                inputs=ofu_inputs,
                note="a counter metric: shown beside MFU, never in its place",
            )
        else:
            self.put("ofu", formula, absent=reason or "no GPU sample yet", label="counters")
        label = f"counters − {self.rig.peak_kind or 'model'}"
        if ofu is not None and self.mfu is not None:
            low, high = ofu - self.mfu[1], ofu - self.mfu[0]
            if low == high:
                self.put("mfu_ofu_gap", "OFU − MFU", value=low, label=label, convention=self.flops.convention)
            else:
                self.put("mfu_ofu_gap", "OFU − MFU", low=low, high=high, label=label)
        else:
            missing = "; ".join(m.absent for m in (self.metrics["ofu"], self.metrics["mfu"]) if m.absent)
            self.put("mfu_ofu_gap", "OFU − MFU", absent=missing or "no MFU range", label=label)
        self.observed(keys, why)
        self.intensity()
        self.energy(latest, why)

    def observed(self, keys: list[str], why: str | None) -> None:
        formula = "Σ over the run's GPUs and samples of OFU × sampling window × dense peak"
        total = 0.0
        ofu_s = 0.0
        samples = 0
        reason = why
        for key in keys:
            gpu = self.state.gpus.get(key)
            peak = self.gpu_numbers.get(key, (None, None))[1]
            if gpu is None or not gpu.ofu_samples:
                reason = reason or f"no sample from {key} with tensor activity, SM clock and tensor clock"
            elif peak is None:
                reason = reason or f"no dense peak for {key}"
            else:
                total += fm.observed_flops(gpu.ofu_s, peak)
                ofu_s += gpu.ofu_s
                samples += gpu.ofu_samples
        if reason is None and keys:
            inputs = {
                "ofu_seconds": _EI(value=ofu_s, unit="s", source=f"Σ OFU × window over {samples} samples")
            }
            self.put(
                "observed_flops",
                formula,
                value=total,
                unit="FLOP",
                label="counters, approximate",
                inputs=inputs,
                note="from counters, not a model count: carries no FLOPs-per-token convention",
            )
        else:
            self.put(
                "observed_flops",
                formula,
                absent=reason or "no GPU sample yet",
                unit="FLOP",
                label="counters, approximate",
            )

    def intensity(self) -> None:
        formula = "ridge × MFU / DRAM active, ridge = Σ dense peak / Σ memory bandwidth"
        label = "aggregate over the window, not per kernel"
        rig = self.rig
        bandwidth = 0.0
        reason = None
        for device in rig.devices:
            if device.memory_bandwidth_bps is None:
                reason = f"no memory bandwidth in the spec of {device.key}"
                break
            bandwidth += device.memory_bandwidth_bps
        reason = rig.absent or reason or self.metrics["mfu"].absent or self.metrics["dram_active"].absent
        peak = rig.peak_total_flops
        if reason is not None or self.mfu is None or peak is None or not self.dram_active:
            self.put(
                "arithmetic_intensity",
                formula,
                absent=reason or "DRAM active is 0",
                unit="FLOP/byte",
                label=label,
            )
            return
        low = fm.arithmetic_intensity(self.mfu[0], peak, bandwidth, self.dram_active)
        high = fm.arithmetic_intensity(self.mfu[1], peak, bandwidth, self.dram_active)
        inputs = {
            "ridge_flop_per_byte": _EI(value=fm.ridge_flop_per_byte(peak, bandwidth), unit="FLOP/byte"),
            "dram_active": _EI(value=self.dram_active, source="counters"),
        }
        if low == high:
            self.put(
                "arithmetic_intensity",
                formula,
                value=low,
                unit="FLOP/byte",
                label=label,
                inputs=inputs,
                convention=self.flops.convention,
            )
        else:
            self.put(
                "arithmetic_intensity",
                formula,
                low=low,
                high=high,
                unit="FLOP/byte",
                label=label,
                inputs=inputs,
            )

    def energy(self, latest: list[GpuState], why: str | None) -> None:
        formula = "Σ over the run's GPUs of ∫ power dt over their samples"
        reason = why
        total = 0.0
        for gpu in latest:
            if not gpu.power_samples:
                reason = (
                    reason
                    or gpu.absent.get("power_w")
                    or f"no two power readings from {gpu.host}/gpu{gpu.index}"
                )
            total += gpu.energy_j
        if reason is None and latest:
            self.put("energy_j", formula, value=total, unit="J")
        else:
            self.put("energy_j", formula, absent=reason or "no GPU sample yet", unit="J")

    def time_split(self) -> dict[str, float]:
        state = self.state
        if state.start_t is None or state.now_t is None:
            self.put("goodput", "(compute + data wait after the first step) / elapsed", absent=_NO_STEP)
            return {}
        split = fm.time_split(
            start_t=state.start_t,
            now_t=state.now_t,
            first_step_t=state.first_step_t,
            last_step_t=state.last_step_t,
            phase_s=state.phase_s,
            phase_after_last_s=state.phase_after_last_s,
            final=self.final,
        )
        self.elapsed_s = state.now_t - state.start_t
        # The agent says per probe "attached" or "not attached: <why>" (probe.<part> facts). A part with no phase
        # and no attached probe may be hiding inside compute, and the explain says so.
        unattached: list[str] = []
        for part in ("compile", "data_wait", "checkpoint", "eval"):
            status = state.facts.value(f"probe.{part}")
            if part in state.phases_seen or status == "attached":
                continue
            why = status.removeprefix("not attached: ") if isinstance(status, str) else "no probe reported"
            unattached.append(f"{part} ({why})")
        note = None
        if unattached:
            note = "stays in compute, its probe never attached: " + "; ".join(unattached)
        if not self.lean:
            self.explain["time_split"] = rec.Explain(
                formula="elapsed = startup_compile + data_wait + checkpoint + eval + profiler + compute (+ after_last_step)",
                inputs={name: _EI(value=value, unit="s") for name, value in split.items()},
                note=note,
            )
        formula = "(compute + data wait after the first step) / elapsed"
        if state.first_step_t is None or self.elapsed_s <= 0:
            self.put("goodput", formula, absent=_NO_STEP)
        else:
            self.put(
                "goodput",
                formula,
                value=fm.goodput(split["compute"], split["data_wait"], self.elapsed_s),
                note=note,
                inputs={
                    "compute_s": _EI(value=split["compute"], unit="s"),
                    "data_wait_s": _EI(value=split["data_wait"], unit="s"),
                    "elapsed_s": _EI(value=self.elapsed_s, unit="s"),
                },
            )
        return split

    def ranks(self) -> list[rec.RankStat]:
        state = self.state
        device_of = {rank: d.key for d in self.rig.devices for rank in d.ranks}
        stats = [
            rec.RankStat(
                rank=r, host=s.host, steps=s.steps, step_time_s=s.step_time_ema_s, device=device_of.get(r)
            )
            for r, s in sorted(state.ranks.items())
        ]
        timed = [s for s in stats if s.step_time_s is not None]
        formula = "(max − min) / median of the per-rank step-time EMAs"
        if len(timed) < 2:
            self.put("straggler_spread", formula, absent="needs step times from 2 or more ranks")
        else:
            spread, slowest = fm.straggler_spread([s.step_time_s for s in timed])  # type: ignore[misc]
            inputs = {f"rank {s.rank}": _EI(value=s.step_time_s, unit="s", source=s.host) for s in timed}
            inputs["slowest_rank"] = _EI(value=timed[slowest].rank, source=timed[slowest].host)
            self.put(
                "straggler_spread",
                formula,
                value=spread,
                inputs=inputs,
                note=f"the slowest rank is {timed[slowest].rank} on {timed[slowest].host}",
            )
        return stats

    def plan(self) -> None:
        facts = self.state.facts
        for name, unit, flag in (("plan_mfu", None, "--plan-mfu"), ("plan_hours", "h", "--plan-hours")):
            value = number(facts.value(name))
            if value is None:
                self.put(name, "declared", absent=f"plan not declared: pass {flag}", unit=unit)
            else:
                self.put(
                    name,
                    "declared",
                    value=value,
                    unit=unit,
                    label="declared",
                    inputs={name: _EI(value=value, source=_fact_source(facts.get(name)))},
                )
        formula = "(elapsed + ETA) / 3600"
        if self.eta_s is not None and self.elapsed_s is not None:
            self.put(
                "projected_hours",
                formula,
                value=fm.projected_hours(self.elapsed_s, self.eta_s),
                unit="h",
                inputs={
                    "elapsed_s": _EI(value=self.elapsed_s, unit="s"),
                    "eta_s": _EI(value=self.eta_s, unit="s"),
                },
            )
        else:
            self.put(
                "projected_hours",
                formula,
                absent=self.metrics["eta_s"].absent or "no elapsed time yet",
                unit="h",
            )
        formula = "elapsed × n_devices / 3600"
        if self.rig.absent or self.elapsed_s is None:
            self.put("gpu_hours", formula, absent=self.rig.absent or "no elapsed time yet", unit="h")
        else:
            n = len(self.rig.devices)
            self.put(
                "gpu_hours",
                formula,
                value=fm.gpu_hours(self.elapsed_s, n),
                unit="h",
                inputs={"n_devices": _EI(value=n, source="device facts")},
            )

    def host(self) -> None:
        host, node = self.state.host_sample, self.state.node_sample
        rows = (
            ("host_cpu_cores", "cores", host, "cpu_cores", "the run's process tree"),
            ("host_rss_b", "B", host, "rss_b", "the run's process tree"),
            ("node_cpu_iowait", None, node, "cpu_iowait", "the node"),
            ("node_mem_available_b", "B", node, "mem_available_b", "the node"),
        )
        for key, unit, sample, field, scope in rows:
            value = getattr(sample, field) if sample is not None else None
            formula = f"the latest {field} of {scope}"
            if value is None:
                why = sample.absent.get(field) if sample is not None else None
                self.put(key, formula, absent=why or "no host sample yet", unit=unit)
            else:
                self.put(key, formula, value=float(value), unit=unit, window_end_t=sample.t)  # type: ignore[union-attr]

    def alert_inputs(self) -> None:
        """What the alert rules read and no other metric gives: staleness, medians, liveness, GPU health, space, exit."""
        state = self.state
        now = state.now_t
        self.put_steps(now)
        self.put_loss()
        if state.child_alive is None:
            self.put("child_alive", "the latest tick's child_alive", absent="no tick yet")
        else:
            self.put(
                "child_alive",
                "the latest tick's child_alive (0 once the run ended)",
                value=float(state.child_alive),
            )
        formula = "now − the end of rank 0's latest eval or checkpoint span"
        if state.pause_end_t is None or now is None:
            self.put("since_pause_s", formula, absent="no eval or checkpoint span yet", unit="s")
        else:
            self.put(
                "since_pause_s",
                formula,
                value=max(0.0, now - state.pause_end_t),
                unit="s",
                label=state.pause_phase,
            )
        for key, gpu in sorted(state.gpus.items()):
            self.put_gpu_health(key, gpu)
        self.put_space()
        formula = "run.end's exit code and signal"
        if not state.finished:
            for key in ("exit_code", "exit_signal"):
                self.put(key, formula, absent="the run has not ended")
        else:
            code, sig = state.exit_code, state.exit_signal
            if code is None:
                self.put(
                    "exit_code", formula, absent="no exit code: the command was signalled or never started"
                )
            else:
                self.put("exit_code", formula, value=float(code))
            if sig is None:
                self.put("exit_signal", formula, absent="no signal: the command exited")
            else:
                self.put("exit_signal", formula, value=float(sig), label=state.exit_signal_name)

    def put_steps(self, now: float | None) -> None:
        state = self.state
        formula = "now − the t of rank 0's latest step"
        if state.last_step_t is None or now is None:
            self.put("since_step_s", formula, absent=_NO_STEP, unit="s")
        else:
            self.put("since_step_s", formula, value=max(0.0, now - state.last_step_t), unit="s")
        window = f"median of rank 0's latest {STEP_WINDOW} step intervals, profiled steps left out"
        if state.recent_intervals_s:
            inputs = {"steps": _EI(value=len(state.recent_intervals_s), source="rank 0 step records")}
            median = fm.median(state.recent_intervals_s)
            self.put("step_time_median_s", window, value=median, unit="s", inputs=inputs)
        else:
            self.put(
                "step_time_median_s",
                window,
                absent=_NO_STEP if not state.steps else "one step so far: an interval needs two",
                unit="s",
            )
        formula = f"median over rank 0's latest {STEP_WINDOW} steps of tokens / step interval"
        if state.recent_rates:
            inputs = {"steps": _EI(value=len(state.recent_rates), source="rank 0 step records with tokens")}
            self.put(
                "tokens_per_s_median",
                formula,
                value=fm.median(state.recent_rates),
                unit="tokens/s",
                inputs=inputs,
            )
        else:
            self.put(
                "tokens_per_s_median",
                formula,
                absent=self.tps_absent if self.tps is None else _NO_TOKENS,
                unit="tokens/s",
            )

    def put_loss(self) -> None:
        state = self.state
        formula = "count of train_loss values that were NaN or infinite"
        if not state.loss_seen:
            for key in ("loss_nonfinite", "loss_tick_max"):
                self.put(key, formula, absent="no train_loss reported")
            return
        self.put("loss_nonfinite", formula, value=float(state.loss_nonfinite))
        formula = "the largest finite train_loss since the previous tick"
        if state.loss_tick_max is None:
            self.put("loss_tick_max", formula, absent="no finite train_loss since the previous tick")
        else:
            self.put("loss_tick_max", formula, value=state.loss_tick_max)

    def put_gpu_health(self, key: str, gpu: GpuState) -> None:
        now = self.state.now_t
        if now is not None and gpu.t is not None and now - gpu.t > _STALE_GPU_S:
            why = f"no sample from {key} for {now - gpu.t:.0f} s: it is no longer watched"
            for name in _GPU_HEALTH:
                self.put(f"{name}.{key}", "the latest sample of the GPU", absent=why)
            return
        # A lost GPU's row reads "GPU lost" for every field, so each number below is absent with that reason.
        why = gpu.absent.get("throttle") or gpu.absent.get("clock_event_reasons")
        for name, reasons in (
            ("gpu_power_throttle", _POWER_REASONS),
            ("gpu_thermal_throttle", _THERMAL_REASONS),
        ):
            formula = f"1 while a clock event reason of {', '.join(reasons)} is active, else 0"
            if why is not None:
                self.put(f"{name}.{key}", formula, absent=why)
                continue
            active = [reason for reason in gpu.throttle if reason in reasons]
            self.put(f"{name}.{key}", formula, value=1.0 if active else 0.0, label=",".join(active) or None)
        self.put(
            f"gpu_xid.{key}", "count of the Xid events in every sample so far", value=float(gpu.xid_count)
        )
        formula = "the latest Xid event's code"
        if gpu.xid_last is None:
            self.put(f"gpu_xid_last.{key}", formula, absent="no Xid event so far")
        else:
            self.put(f"gpu_xid_last.{key}", formula, value=float(gpu.xid_last))
        formula = "the latest volatile uncorrectable ECC error count"
        if gpu.ecc_uncorrected is None:
            why = gpu.absent.get("ecc_uncorrected") or f"no ECC count from {key}"
            self.put(f"gpu_ecc_uncorrected.{key}", formula, absent=why)
        else:
            self.put(f"gpu_ecc_uncorrected.{key}", formula, value=float(gpu.ecc_uncorrected))
        formula = f"1 while the sampler's row reads '{GPU_LOST}' (NVML: the GPU fell off the bus), else 0"
        self.put(f"gpu_lost.{key}", formula, value=1.0 if gpu.lost else 0.0)

    def put_space(self) -> None:
        node = self.state.node_sample
        worst: dict[str, rec.FsStat] = {}
        unread: dict[str, str] = {}
        for fs in node.filesystems if node is not None else []:
            if fs.total_b is None or fs.avail_b is None or fs.total_b <= 0:
                unread[fs.role] = f"no size reading for {fs.path}"
                continue
            held = worst.get(fs.role)
            if held is None or fs.avail_b / fs.total_b < held.avail_b / held.total_b:  # type: ignore[operator]
                worst[fs.role] = fs
        for role in ("run", "checkpoints", "shm"):
            fs = worst.get(role)
            formula = f"available / total bytes of the fullest filesystem holding the {role} folders"
            if fs is None:
                why = unread.get(role) or (
                    "no checkpoint written yet" if role == "checkpoints" else "no filesystem sample yet"
                )
                self.put(f"disk_free.{role}", formula, absent=why)
                self.put(f"disk_avail_b.{role}", formula, absent=why, unit="B")
                continue
            inputs = {"total_b": _EI(value=fs.total_b, unit="B", source=fs.mount or fs.path)}
            self.put(
                f"disk_free.{role}", formula, value=fs.avail_b / fs.total_b, label=fs.path, inputs=inputs
            )  # type: ignore[operator]
            self.put(f"disk_avail_b.{role}", formula, value=float(fs.avail_b), unit="B", label=fs.path)  # type: ignore[arg-type]
        formula = "MemAvailable / MemTotal, or the cgroup's room / its limit where that is less"
        if node is None or node.mem_available_b is None or not node.mem_total_b:
            why = node.absent.get("mem_available_b") if node is not None else None
            self.put("node_mem_available", formula, absent=why or "no host sample yet")
            return
        free = node.mem_available_b / node.mem_total_b
        label = "node"
        limit, used = node.cgroup_mem_limit_b, node.cgroup_mem_used_b
        if limit and used is not None and (limit - used) / limit < free:
            free, label = max(0.0, (limit - used) / limit), "cgroup"
        self.put("node_mem_available", formula, value=free, label=label)


def build_snapshot(engine: Engine, final: bool, lean: bool = False) -> rec.Snapshot:
    """The snapshot of ``engine``'s state: every metric, its explain, the series, ranks, time split, facts, warnings.

    ``lean`` builds only the metrics history keeps over time, without explain: for catching up quietly.
    """
    state = engine.state
    snap = _Snapshot(engine, final, lean)
    if lean:
        snap.throughput()
        snap.mfu_metrics()
        snap.counters()
        snap.time_split()
        return rec.Snapshot(tick=state.tick, metrics=snap.metrics)
    snap.throughput()
    snap.flops_per_token()
    snap.budget()
    snap.mfu_metrics()
    snap.counters()
    phases = snap.time_split()
    ranks = snap.ranks()
    snap.plan()
    snap.host()
    snap.alert_inputs()
    warnings = list(engine.fact_warnings)
    if state.tokens_mismatch is not None and engine._declared_tokens_per_step is not None:
        warnings.append(
            f"tokens_per_step declared {engine._declared_tokens_per_step} but detected {state.tokens_mismatch}: "
            "using the declared value"
        )
    experts = number(state.facts.value("moe_experts"))
    if experts is not None and experts > 1:
        warnings.append(
            f"the model has {experts:g} experts: total parameters overstate FLOPs; declare the active parameters "
            "with --params"
        )
    return rec.Snapshot(
        t=state.now_t if state.now_t is not None else 0.0,
        wall=state.now_wall,
        source="engine",
        tick=state.tick,
        final=final,
        state="finished" if final else ("running" if state.steps else "starting"),
        elapsed_s=snap.elapsed_s,
        steps=state.steps,
        tokens=state.tokens_seen if state.steps_with_tokens else None,
        metrics=snap.metrics,
        explain=snap.explain,
        series=dict(state.series),
        ranks=ranks,
        phases_s=phases,
        facts=dict(state.facts.winners),
        warnings=warnings,
        through_seq=state.through_seq,
    )


_GPU_HEALTH = (
    "gpu_power_throttle",
    "gpu_thermal_throttle",
    "gpu_xid",
    "gpu_xid_last",
    "gpu_ecc_uncorrected",
    "gpu_lost",
)


def _keep_recent(values: list[float], value: float) -> None:
    values.append(value)
    if len(values) > STEP_WINDOW:
        del values[0]


def _per_gpu(gpus: list[GpuState], name: str, why: str | None) -> tuple[list[float], str | None]:
    if why is not None:
        return [], why
    if not gpus:
        return [], "no GPU sample yet"
    values: list[float] = []
    for gpu in gpus:
        value = getattr(gpu, name)
        if value is None:
            return [], gpu.absent.get(name) or f"{name} not reported by {gpu.host}/gpu{gpu.index}"
        values.append(value)
    return values, None


def _gpu_numbers(facts: FactTable) -> dict[str, tuple[float | None, float | None]]:
    """Per sampled GPU (``<host>/gpu<i>``): its spec's tensor clock (MHz) and dense peak (FLOP/s), each if positive."""
    numbers: dict[str, tuple[float | None, float | None]] = {}
    for fact in facts.scoped("gpu"):
        value = fact.value if isinstance(fact.value, dict) else {}
        clock, peak = number(value.get("tensor_clock_mhz")), number(value.get("dense_bf16_flops"))
        numbers[str(fact.device)] = (
            clock if clock and clock > 0 else None,
            peak if peak and peak > 0 else None,
        )
    return numbers


def _finite(*values: float | None) -> bool:
    for value in values:
        if value is not None and not -math.inf < value < math.inf:
            return False
    return True


def _peak_inputs(rig: Rig) -> dict[str, rec.ExplainInput]:
    if rig.absent:
        return {}
    inputs = {"n_devices": _EI(value=len(rig.devices), source="device facts of ranks")}
    groups: dict[tuple[Any, ...], list[RigDevice]] = {}
    for device in rig.devices:
        groups.setdefault((device.peak_flops, device.peak_kind, device.peak_source, device.name), []).append(
            device
        )
    if len(groups) == 1:
        (peak, kind, source, name), _ = next(iter(groups.items()))
        inputs["peak_flops_per_device"] = _EI(
            value=peak, unit="FLOP/s", source=f"{name}, {kind} peak: {source}"
        )
    else:
        for device in rig.devices:
            inputs[f"peak_flops {device.key}"] = _EI(
                value=device.peak_flops,
                unit="FLOP/s",
                source=f"{device.name}, {device.peak_kind} peak: {device.peak_source}",
            )
    if rig.peak_total_flops is not None:
        inputs["peak_total_flops"] = _EI(
            value=rig.peak_total_flops, unit="FLOP/s", source="Σ over the devices"
        )
    return inputs


def _positive(value: Any) -> float | None:
    result = number(value)
    return result if result is not None and result > 0 else None


def _fact_source(fact: rec.Fact | None) -> str | None:
    return None if fact is None else f"{fact.provenance} ({fact.origin})"


def _join(notes: list[str]) -> str | None:
    return "; ".join(notes) if notes else None
