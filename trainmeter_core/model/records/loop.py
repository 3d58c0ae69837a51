"""What the training loop does, as its processes report it: ``step``, ``metric``, ``phase``, ``fact``, ``notice``, and
the hub's ``tick``, the clock the engine counts time by. Each kind is defined here once; the package's face puts it
in the union. Pure: no I/O, no clock.
"""

# Annotations are evaluated at import, as header.py says why.
from typing import Any, Literal

from trainmeter_core.model.records.header import Record

Provenance = Literal["declared", "emitted", "detected", "assumed"]


class Fact(Record, tag="fact", kw_only=True):
    """One input with its provenance: declared (flag or tm.toml) > emitted > detected > assumed."""

    name: str
    value: Any = None
    provenance: Provenance
    origin: str  # "--budget-tokens", "tm.toml:budget_tokens", "agent:model", "sampler:nvml", ...
    unit: str | None = None
    device: str | None = None  # for per-device facts: "<host>/gpu<index>" or "<host>/cpu"
    note: str | None = None
    warning: str | None = None


TokenSource = Literal["input_ids", "attention_mask", "declared", "emitted"]


class Step(Record, tag="step", kw_only=True):
    """One training iteration on one rank: the first optimizer step after a backward pass.

    Several optimizers stepping in one iteration count once; a step that GradScaler skipped still counts, marked
    ``skipped``. ``step_time_s`` is the time since this rank's previous step (absent for the first). Tokens are this
    rank's; ``tokens_global`` is tokens × the data-parallel degree.
    """

    step: int
    skipped: bool = False
    profiled: bool = False
    step_time_s: float | None = None
    micro_batches: int | None = None
    tokens: int | None = None
    tokens_source: TokenSource | None = None
    tokens_global: int | None = None
    dp: int | None = None
    optimizers: int | None = None  # optimizer.step calls seen in the previous iteration
    # The agent's own time in this iteration, where it timed itself: one iteration in 16 (steps 16, 32, ...)
    agent_us: float | None = None
    # On a process's first step only: the step its training resumed after, read from the optimizer's restored
    # state (its ``step``), so the steps of a resumed run go on where its checkpoint left them
    resumed_from: int | None = None


class Metric(Record, tag="metric", kw_only=True):
    """Numbers the loop reported, by ``emit()`` or a tracker tap, under the raw keys the loop used; or the loss the
    loop passed to ``backward()``, as ``train_loss`` with origin ``backward`` (it loses to any other origin)."""

    values: dict[str, float]
    step: int | None = None  # the loop's own step if it gave one, else the agent's iteration count
    origin: str = "emit"  # "emit", "wandb", "tensorboard", "tensorboardx", "mlflow", "backward", ...


PhaseName = Literal["startup", "compile", "data_wait", "checkpoint", "checkpoint_load", "eval", "profiler"]


class Phase(Record, tag="phase", kw_only=True):
    """A span of time the loop spent outside plain compute, seen by a probe."""

    phase: PhaseName
    start_t: float
    end_t: float
    step: int | None = None
    probe: str = ""
    paths: list[str] = []  # checkpoint files written, so the disk holding them can be watched
    detail: str | None = None


class Notice(Record, tag="notice", kw_only=True):
    """A one-line message from a process of the run (an agent probe that went quiet, a diagnosis)."""

    level: Literal["info", "warning", "error"] = "warning"
    topic: str
    message: str


class Tick(Record, tag="tick", kw_only=True):
    """The hub's once-a-second clock: the engine's and the alert rules' only notion of time passing."""

    n: int
    interval_s: float
    child_alive: bool = True
