"""What the engine knows between records: the step clock, the ranks, the GPUs, the time split, the loop's series.
Pure data (msgspec Structs, so a checkpoint is one encode); the engine changes it, the metric families read it."""

from __future__ import annotations

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.engine.training_window import StepSpan, WindowSum
from trainmeter_core.model.facts import FactTable

# The GPU counters averaged over the training window (OFU is computed per sample): the keys of ``GpuState.window``.
GPU_WINDOW_FIELDS = (
    "util_gpu",
    "sm_active",
    "tensor_active",
    "dram_active",
    "power_w",
    "clock_sm_mhz",
    "ofu",
)
# How many of rank 0's latest steps the alert inputs' medians look at (odd, so a median is one of them).
STEP_WINDOW = 21


class RankState(msgspec.Struct, kw_only=True):
    """One rank's steps: its count (the steps it kept: those a resumed attempt did again count once, as the run's
    ``steps``), its step-time EMA, and its latest step's number and time (its own host's clock)."""

    host: str = ""
    steps: int = 0
    step_time_ema_s: float | None = None
    last_t: float | None = None
    last_step: int | None = None
    # Its data wait (model/engine/collectives.py): the data_wait phases since its previous step (None until its first
    # data_wait phase: before that the rank's data wait is unknown), and their EMA per step.
    data_wait_open_s: float | None = None
    data_wait_ema_s: float | None = None
    # Its collectives, from the collective probe's metric records (origin "collectives"): the exposed wait's EMA per
    # step, the steps that reported one, and each operation kind and group size ("all_reduce.4").
    collective_wait_ema_s: float | None = None
    collective_steps: int = 0
    collectives: dict[str, CollectiveOp] = {}
    # The same waits by stretches of steps, for the straggler's comparison over the steps every rank reported
    # (collectives.STRETCH_STEPS steps a stretch, numbered step // STRETCH_STEPS): its latest stretches' numbers,
    # ascending, and each one's sum of waits and count of steps.
    wait_stretches: list[int] = []
    wait_sums_s: list[float] = []
    wait_counts: list[int] = []


class CollectiveOp(msgspec.Struct, kw_only=True):
    """One kind of collective of one rank, in groups of one size: EMAs per step of the bytes it contributed, the
    collectives' measured time and their count, over the steps that ran one."""

    op: str
    group_size: int
    bytes_ema: float | None = None
    time_ema_s: float | None = None
    count_ema: float | None = None
    steps: int = 0


class GpuState(msgspec.Struct, kw_only=True):
    """One GPU's latest sample and what the engine integrates over its samples (energy, OFU × window, the counters
    over the training window)."""

    host: str
    index: int
    uuid: str | None = None
    t: float | None = None
    util_gpu: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    power_w: float | None = None
    # where the latest sample's rates start (they end at t): GPM's window, and GPU-Util's where NVML says it
    gpm_start_t: float | None = None
    util_start_t: float | None = None
    absent: dict[str, str] = {}
    energy_j: float = (
        0.0  # ∫ sampled power dt over the samples that were the run's: the fallback without a counter
    )
    power_samples: int = 0
    # NVML's total energy counter (J since the driver loaded): the latest reading and its t, Σ of its rises over the
    # run's intervals, how many intervals counted, and how many were dropped because it went backwards (a driver
    # reload, a GPU reset); the sampler's reason when the latest reading is missing.
    counter_j: float | None = None
    counter_t: float | None = None
    counter_energy_j: float = 0.0
    counter_intervals: int = 0
    counter_dropped: int = 0
    counter_absent: str | None = None
    # Who else the counter counts: a MIG slice's parent GPU, every pid seen on it outside the run, or why tm could not
    # tell; and whether a sample said it is the run's GPU (not only watched for the hardware view).
    mig_parent_uuid: str | None = None
    other_pids: list[int] = []
    others_unknown: str | None = None
    for_run: bool = False
    ofu_s: float = 0.0  # Σ OFU × GPM window, for observed FLOPs
    ofu_samples: int = 0
    ofu_missed: int = 0  # samples whose OFU could not be computed (no GPM, no clock basis)
    ofu_label: str | None = None  # the clock basis of the latest sample's OFU, as the label says it
    ofu_basis: str | None = None  # … and as the explain says it
    window: dict[str, WindowSum] = {}  # GPU_WINDOW_FIELDS over the training window of this GPU's host
    # for the alert rules: the latest clock event reasons, Xids counted over every sample, ECC, lost
    throttle: list[str] = []
    xid_count: int = 0
    xid_last: int | None = None
    ecc_uncorrected: int | None = None
    lost: bool = False


class PendingPoint(msgspec.Struct, kw_only=True):
    """A value held back from a series, with the x values and wall time it arrived at."""

    point: records.SeriesPoint
    x_step: float
    x_tokens: float
    x_flop: float
    wall: float


class NodeState(msgspec.Struct, kw_only=True):
    """One node of a job, from the job hub's ``node`` and ``clock`` records and the node's own records (mapped)."""

    node_rank: int
    state: str = "live"
    node_run: str | None = None
    last_t: float | None = None  # the latest record from the node, on the hub's clock
    last_kind: str | None = None
    behind: int | None = None
    gaps: int = 0
    gap_records: int = 0
    offset_s: float | None = None
    uncertainty_s: float | None = None
    basis: str | None = None
    lag_ema_s: float | None = None  # how long after the first node its ranks report a step (hub's clock)
    steps: int = 0


class AttemptState(msgspec.Struct, kw_only=True):
    """One start of the run (``run.start``): a resumed run has several in one log. Times are on the engine's timeline,
    which continues across attempts (``EngineState.t_offset``)."""

    attempt: int
    host: str = ""
    start_t: float
    start_wall: float
    end: str = "running"
    first_step: int | None = None
    first_step_t: float | None = None
    last_step: int | None = None
    last_t: float | None = None  # its latest record
    last_wall: float | None = None
    gap_s: float | None = None
    resumed_from: int | None = None
    resumed_from_source: str | None = None
    superseded_steps: int = 0
    superseded_s: float = 0.0
    superseded_note: str | None = None
    split_end: dict[str, float] = {}  # the run's time split as it stood at this attempt's end (time_split.py)


class Resume(msgspec.Struct, kw_only=True):
    """What a resumed run's accounting carries: the time between attempts, and the steps done twice.

    ``stepping_s`` is the time from each attempt's first step to its latest (rank 0), summed over attempts;
    ``stepping_phase_s`` the phases inside those stretches and ``stepping_wait_s`` their data wait: a step mark keeps
    the three, so the stretch after a checkpoint that a later attempt redid can be taken out of the time that trained.
    A mark is ``(step, t, steps, tokens_seen, steps_with_tokens, stepping_s, stepping_phase_s, stepping_wait_s)``.
    """

    t_offset: float = 0.0  # added to the t of every record of the current attempt (another host, or a reboot)
    attempt_start_t: float | None = (
        None  # the current attempt's start: readings from before it are no previous one
    )
    down_s: float = 0.0  # Σ the time from an attempt's end (its last tick or step) to the next start
    restart_s: float = (
        0.0  # Σ, over closed joins, the rest of the time from a last step to the next first step
    )
    join_s: float = (
        0.0  # Σ, over closed joins, the time from the last step before an attempt to its first step
    )
    open_down_s: float = 0.0  # the downtime inside the join still open (the current attempt has not stepped)
    superseded_steps: int = 0
    superseded_s: float = 0.0  # compute of the steps done again
    superseded_tokens: int = 0
    stepping_s: float = 0.0
    stepping_phase_s: float = 0.0
    stepping_wait_s: float = 0.0
    phase_after_step_s: float = (
        0.0  # what of stepping_phase_s lies after the latest step (not in a stretch yet)
    )
    wait_after_step_s: float = 0.0
    # The badput buckets (time_split.py): each attempt's start to its first step, and its last step to its end
    startup_s: float = 0.0  # Σ, over attempts that stepped, the time from their start to their first step
    before_step_phase_s: float = (
        0.0  # Σ the phases inside those stretches (and the current one's, while open)
    )
    after_step_s: float = (
        0.0  # Σ, over ended attempts, the time from their last step to their end, less phases
    )
    hang_s: float = 0.0  # Σ the hangs closed (hangs.py), less the phases inside them
    hang_from_t: float | None = None  # an open hang: the step it stalled after
    marks: list[tuple[int, float, int, int, int, float, float, float]] = []  # rank 0's latest steps
    checkpoint_marks: list[tuple[int, float, int, int, int, float, float, float]] = []  # checkpoints written


class ProfileState(msgspec.Struct, kw_only=True):
    """Every profile trace imported (by ``trace_id``, in import order) and the profiled steps of each."""

    traces: dict[str, records.ProfileImport] = {}
    steps: dict[str, list[records.ProfileImport]] = {}


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
    # the step clock: rank 0 (or a single process); on a node of a job that does not hold rank 0, its first rank heard
    # from (None until then: nodes.py)
    clock_rank: int | None = 0
    steps: int = 0
    last_step: int | None = None
    first_step_t: float | None = None
    last_step_t: float | None = None
    last_step_wall: float | None = None  # with now_t and now_wall, where an attempt ended (attempts.ended)
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
    # series a tracker tap reported: they beat the agent's loss from backward()
    tapped_series: dict[str, bool] = {}
    # the agent's loss from backward(), held until the iteration is over: the loop's own value for that step (emit()
    # after optimizer.step(), say) replaces it; otherwise it goes in at the next step, tick or the run's end
    pending_backward: dict[str, PendingPoint] = {}
    series: dict[str, records.SeriesPoint] = {}
    # samplers
    gpus: dict[str, GpuState] = {}
    gpu_absent: str | None = None  # the GPU sampler's row saying the node has no GPU it can read ("no NVML")
    host_sample: records.SampleHost | None = None
    node_sample: records.SampleNode | None = None
    # the training window of each host (its first and latest step, any rank), and the host counters over it
    step_spans: dict[str, StepSpan] = {}
    host_window: dict[str, WindowSum] = {}
    startup_phase_s: dict[
        str, float
    ] = {}  # rank 0's phases before the first step (compile), which startup holds
    # what the alert rules read besides the metrics above (docs/metrics.md, "Alert inputs")
    child_alive: bool | None = None  # from the latest tick; False once the run ended
    recent_intervals_s: list[float] = []  # rank 0's latest STEP_WINDOW step intervals, profiled ones left out
    recent_rates: list[float] = []  # tokens / interval of those steps, where a step had tokens
    pause_phase: str | None = None  # the latest eval or checkpoint span of rank 0, and when it ended
    pause_end_t: float | None = None
    loss_seen: bool = False
    loss_nonfinite: int = 0  # train_loss values that were NaN or infinite, over the run
    loss_tick_max: float | None = None  # the largest finite train_loss since the previous tick
    loss_tick_nonfinite_step: int | None = (
        None  # the step of the first NaN or infinite one since the previous tick
    )
    loss_nonfinite_by_tick: int = 0  # loss_nonfinite at the previous tick
    exit_code: int | None = None
    exit_signal: int | None = None
    exit_signal_name: str | None = None
    # imported profiler results (model/engine/profiles.py)
    profiles: ProfileState = msgspec.field(default_factory=ProfileState)
    # a job of several nodes (model/engine/nodes.py): the host whose run this is (its first run.start's), the job,
    # each other node by host, and the mapped time each host's ranks reported the latest steps
    host: str | None = None
    job: records.JobPlace | None = None
    nodes: dict[str, NodeState] = {}
    step_marks: dict[int, dict[str, float]] = {}
    own_lag_ema_s: float | None = None

    # a resumed run: its attempts, and the accounting across them (model/engine/attempts.py)
    attempts: list[AttemptState] = []
    resume: Resume = msgspec.field(default_factory=Resume)
    attempt_stepped: bool = False  # rank 0 stepped in the current attempt (the run's first, or a resumed one)
