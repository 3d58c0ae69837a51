"""The public plugin API: a Protocol for every object a hook returns, ``hookimpl``, and the helpers and record types a
plugin uses (and ``subscribe``, for a tool of one's own on a run's bus). ``hookimpl`` and this module are all a plugin
imports; every other module of tm is internal.

Importing it must stay cheap, because tracker taps load inside the training process: it imports the dependency-free
hook marker and ``typing`` only, and resolves everything else on first use (PEP 562), so ``ComponentContext`` brings in
zmq only in the processes that run a component. Measured with ``bench/bench_api_import.py`` on this project's
loaded 2-core machine: 5.8 ms (median of 30 fresh interpreters) where ``typing`` was imported already, as in a
training process (torch imports it), 10 ms in a bare interpreter; ``hookimpl`` alone 1.8 ms. Nothing heavy loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from trainmeter_core.hookmarker import PROJECT, hookimpl

# Type checkers and editors see every name here; at run time each resolves on first use (``__getattr__`` below).
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping
    from pathlib import Path
    from types import ModuleType

    from trainmeter_core.bus.client import subscribe
    from trainmeter_core.bus.component import ComponentContext, alerts_until_stopped
    from trainmeter_core.model import money, records
    from trainmeter_core.model.alerts.episodes import Condition, RuleState, Verdict, metric
    from trainmeter_core.model.catalog import is_loss
    from trainmeter_core.model.platform_adapters import (
        FIRST_SAMPLE,
        GPM_BEFORE_HOPPER,
        GPM_BLOCKED,
        GPU_LOST,
        MEASURED_FIELDS,
        NO_NVML,
        NO_PERMISSION,
        NOT_ON_THIS_DEVICE,
        PROFILER_ATTACHED,
        GpuReading,
    )
    from trainmeter_core.model.profiles.builder import ProfileBuilder, profiler_step_number
    from trainmeter_core.model.records import (
        Alert,
        Fact,
        HtaBreakdown,
        KernelStat,
        Metric,
        MetricValue,
        Notice,
        Phase,
        ProfileImport,
        Record,
        RunEnd,
        RunStart,
        SampleGpu,
        SampleHost,
        Severity,
        Snapshot,
        Step,
        Tick,
    )

__all__ = [
    # the marker
    "PROJECT",
    "hookimpl",
    # what hooks return
    "AlertRule",
    "BusComponent",
    "Command",
    "PlatformAdapter",
    "ProfilerImporter",
    "Sink",
    "TapEmit",
    "TrackerTap",
    # components and sinks
    "ComponentContext",
    "alerts_until_stopped",
    # a tool of your own on a run's bus (docs/bus.md)
    "subscribe",
    # alert rules
    "Condition",
    "RuleState",
    "Verdict",
    "metric",
    # the series a loop reports (a snapshot's ``series``)
    "is_loss",
    # platform adapters
    "GpuReading",
    "MEASURED_FIELDS",
    "FIRST_SAMPLE",
    "GPM_BEFORE_HOPPER",
    "GPM_BLOCKED",
    "GPU_LOST",
    "NO_NVML",
    "NO_PERMISSION",
    "NOT_ON_THIS_DEVICE",
    "PROFILER_ATTACHED",
    # profiler importers
    "ProfileBuilder",
    "profiler_step_number",
    # money, a view: a price per GPU-hour and what it makes of a snapshot (never stored; docs/metrics.md#money)
    "money",
    # records (docs/bus.md documents every kind and field)
    "records",
    "Alert",
    "Fact",
    "HtaBreakdown",
    "KernelStat",
    "Metric",
    "MetricValue",
    "Notice",
    "Phase",
    "ProfileImport",
    "Record",
    "RunEnd",
    "RunStart",
    "SampleGpu",
    "SampleHost",
    "Snapshot",
    "Step",
    "Tick",
]


# ---------------------------------------------------------------------------------------------------------------------
# Bus components and sinks (hooks ``trainmeter_components`` and ``trainmeter_sinks``; the hooks return the classes)


@runtime_checkable
class BusComponent(Protocol):
    """A class whose instances live on the bus: tm builds it with no arguments and calls ``run(ctx)`` once.

    ``name``: names it in ``component`` records, for ``TM_DISABLE_COMPONENTS`` and ``TM_OWN_PROCESS``; unique among
    the loaded plugins (the first to take a name wins). ``subscribes``: the record kinds it reads (``("*",)`` for
    every kind, ``()`` for a pure producer such as a sampler). A component that reads ``step``, ``metric`` or
    ``phase`` records gets each as its own record, also those an agent sent in a ``block``; one that names ``"block"``
    among its kinds (``("*", "block")``: every kind) gets each block as it is instead, to take its steps in bulk.
    ``shared``: only tm's built-ins may run as threads of the shared ``components`` process; a plugin's component
    always gets a process of its own, whatever it says.

    ``run(ctx)`` loops until ``ctx.stopping`` is set and then returns; it reads with ``ctx.records(timeout_s)`` or
    ``ctx.recv(timeout_s)`` and publishes with ``ctx.publish(record)`` (:class:`ComponentContext`). Its working
    directory is the one tm was started in; files of its own go in ``ctx.run_dir``. If it raises, it is restarted
    with backoff and a ``component`` record says so. Subclassing this Protocol explicitly is allowed and gives the defaults.
    """

    name: ClassVar[str]
    subscribes: ClassVar[tuple[str, ...]] = ()
    shared: ClassVar[bool] = False

    def run(self, ctx: ComponentContext) -> None: ...


@runtime_checkable
class Sink(BusComponent, Protocol):
    """A bus component that consumes records (alerts, snapshots) and delivers them somewhere: the same contract as
    :class:`BusComponent`, with rules of its own.

    It must never block another component (network I/O with a timeout, reading apart from delivering through a
    bounded queue), retries with backoff and gives up with one ``notice``, drops rather than queues without bound,
    and sends nothing off the node until the user configured a destination (return no class from the hook until
    then). :func:`alerts_until_stopped` yields the alerts, including those of the run's final snapshot.
    """


# ---------------------------------------------------------------------------------------------------------------------
# Alert rules (hook ``trainmeter_alert_rules``; the hook returns instances)


@runtime_checkable
class AlertRule(Protocol):
    """A pure function of its state and one snapshot: no clock (a snapshot's ``t`` is the time), no I/O.

    ``name``: the rule's id (``alert.rule``, and ``[alerts.<name>]`` in ``tm.toml``). ``severity``: of its alerts,
    ``"info"``, ``"warning"`` or ``"critical"``. ``defaults``: its thresholds by name, each a number ≥ 0 a user may
    override in ``tm.toml``, on top of ``fire_after_s`` (0), ``clear_after_s`` (60) and ``flap_window_s`` (600).

    ``evaluate(state, snapshot)`` runs once per snapshot (one a second, also while no step comes) in the ``alerts``
    component and answers a :class:`Verdict`: the subjects whose condition holds (``active``), optionally words for
    those that are fine (``normal``), or ``held=True`` when it cannot judge. ``state.config`` holds the thresholds,
    ``state.memory`` is the rule's own between snapshots (:class:`RuleState`); :func:`metric` reads a snapshot's
    metric. A rule that raises is turned off for the run with one ``notice``.
    """

    name: ClassVar[str]
    severity: ClassVar[Severity] = "warning"
    defaults: ClassVar[Mapping[str, float]] = {}

    def evaluate(self, state: RuleState, snapshot: Snapshot) -> Verdict: ...


# ---------------------------------------------------------------------------------------------------------------------
# Platform adapters (hook ``trainmeter_platform_adapters``; the hook returns the classes by name)


@runtime_checkable
class PlatformAdapter(Protocol):
    """Turns what NVML offers on one kind of machine into the ``sample.gpu`` row schema (:class:`SampleGpu`).

    tm builds the class with no arguments, once per GPU whose device spec names it (``"adapter": "<name>"``), in the
    GPU sampler's own process. ``name``: the name specs use. ``not_offered``: ``{field: reason}`` for the fields this
    kind of machine never has (start the reason with :data:`NOT_ON_THIS_DEVICE`); the sampler never asks NVML for
    them and ``offers(field)`` says so. ``adapt(reading)`` runs after each sample's NVML reads (once a second per GPU):
    fill a field with ``reading.put(field, value)`` or say why it is missing with ``reading.miss(field, reason)``
    (:class:`GpuReading`, fields of :data:`MEASURED_FIELDS`). It must not raise and must not block; a value it cannot
    read is absent with a reason, never a zero. Subclassing this Protocol explicitly gives ``offers`` and an ``adapt``
    that passes NVML through.
    """

    name: ClassVar[str]
    not_offered: ClassVar[Mapping[str, str]] = {}

    def offers(self, field: str) -> bool:
        return field not in self.not_offered

    def adapt(self, reading: GpuReading) -> None:
        """Fill or correct fields after NVML was read; the default passes NVML through."""


# ---------------------------------------------------------------------------------------------------------------------
# Tracker taps (hook ``trainmeter_trackers``, entry point group ``trainmeter.agent``; the hook returns instances)


@runtime_checkable
class TapEmit(Protocol):
    """What a tap is given to hand tm the numbers a tracker logged.

    ``emit(values, step)``: ``values`` maps the tracker's keys (kept raw, e.g. ``"loss/train"``) to numbers or
    0-dimensional CPU tensors; anything else is skipped, and an accelerator tensor is never read (it would
    synchronize the device). ``step`` is the tracker's step, or None. ``on`` turns False once the tap was stopped;
    ``stop(exc)`` stops it, with one line naming the tap and the error (the tracker goes on untouched).
    """

    on: bool

    def __call__(self, values: Mapping[str, object], step: int | None = None) -> None: ...

    def stop(self, exc: BaseException) -> None: ...


@runtime_checkable
class TrackerTap(Protocol):
    """An in-process reader of a logging library's calls (wandb, TensorBoard, MLflow), inside the training process.

    ``name``: the ``origin`` of the ``metric`` records it produces, and the probe ``tap.<name>``. ``module``: the
    library module whose import attaches the tap. ``attach(module, emit)`` runs once, when the user's code has
    imported ``module`` (it is passed in: never import the library yourself); it wraps the library's logging call so
    that, after each call returns, the values it logged go to ``emit`` (:class:`TapEmit`). A tap ignores the
    library's calls to itself (log once per user call), and on any failure calls ``emit.stop(exc)``, which disables
    this tap only. Its module must import nothing heavy: only ``trainmeter_core.api`` of tm.
    """

    name: str
    module: str

    def attach(self, module: ModuleType, emit: TapEmit) -> None: ...


# ---------------------------------------------------------------------------------------------------------------------
# Profiler importers and commands (hooks ``trainmeter_profiler_importers`` and ``trainmeter_commands``; instances)


@runtime_checkable
class ProfilerImporter(Protocol):
    """Reads a profiler's result file (a torch.profiler Chrome trace, an Nsight Systems export) into records.

    ``name``: the importer's name, as the ``profile.import`` records it yields carry it (``importer``).
    ``can_read(path)``: whether this importer reads that file or folder; it looks at the name and the first bytes
    only, quickly, and never raises. ``read(path, run)``: yields :class:`ProfileImport` records, one per profiled step
    (``scope="step"``) and then one for the whole trace (``scope="trace"``), as a stream (traces reach hundreds of MB:
    never load one whole). :class:`ProfileBuilder` does the arithmetic (the classes, each step's window, the split,
    the top kernels, HTA's breakdown), so an importer only reads its file into it. ``run`` is the run's ``meta.json``
    as a mapping (``run_id``, ``host``, ``start_wall``, ``child_pid``, ...). A file it cannot read completely (cut
    short, damaged) is refused by raising ``ValueError`` with one line: then nothing of the import is written.

    Called by ``tm import RUN FILE_OR_DIR...`` and by the launcher at the end of a run (for the traces
    torch.profiler wrote during it, and those of ``--profile-dir``), in tm's own process. tm checks what comes back
    (a trace from another host, process or time is refused unless ``--force``), maps each profiled step to the run's
    step by its wall time (``step_start_wall``/``step_end_wall``: give the profiler's step window on the CPU), and
    writes the records through the run's hub.
    """

    name: str

    def can_read(self, path: Path) -> bool: ...

    def read(self, path: Path, run: Mapping[str, Any]) -> Iterator[Record]: ...


@runtime_checkable
class Command(Protocol):
    """A ``tm`` subcommand: ``tm <name> ...``.

    ``name``: the word after ``tm`` (a name tm has itself, or an earlier plugin took, is reported and skipped).
    ``help``: one line for ``tm --help``. ``add_arguments(parser)``: adds its options to an ``argparse`` parser of
    its own. ``run(args)``: does the work in tm's own process with the parsed options, returns the exit status (0
    when it went well, 2 for a usage error), and reports a problem the user can act on in one line on stderr.
    """

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# ---------------------------------------------------------------------------------------------------------------------
# Everything else resolves on first use, from the one module that defines it.


def _client_module():
    from trainmeter_core.bus import client

    return client


def _component_module():
    from trainmeter_core.bus import component

    return component


def _episodes_module():
    from trainmeter_core.model.alerts import episodes

    return episodes


def _catalog_module():
    from trainmeter_core.model import catalog

    return catalog


def _adapters_module():
    from trainmeter_core.model import platform_adapters

    return platform_adapters


def _profiles_module():
    from trainmeter_core.model.profiles import builder

    return builder


def _money_module():
    from trainmeter_core.model import money

    return money


def _records_module():
    from trainmeter_core.model import records

    return records


_LAZY = {
    "subscribe": _client_module,
    "ComponentContext": _component_module,
    "alerts_until_stopped": _component_module,
    "Condition": _episodes_module,
    "RuleState": _episodes_module,
    "Verdict": _episodes_module,
    "metric": _episodes_module,
    "is_loss": _catalog_module,
    "GpuReading": _adapters_module,
    "MEASURED_FIELDS": _adapters_module,
    "FIRST_SAMPLE": _adapters_module,
    "GPM_BEFORE_HOPPER": _adapters_module,
    "GPM_BLOCKED": _adapters_module,
    "GPU_LOST": _adapters_module,
    "NO_NVML": _adapters_module,
    "NO_PERMISSION": _adapters_module,
    "NOT_ON_THIS_DEVICE": _adapters_module,
    "PROFILER_ATTACHED": _adapters_module,
    "ProfileBuilder": _profiles_module,
    "profiler_step_number": _profiles_module,
    **{
        name: _records_module
        for name in (
            "Alert",
            "Fact",
            "HtaBreakdown",
            "KernelStat",
            "Metric",
            "MetricValue",
            "Notice",
            "Phase",
            "ProfileImport",
            "Record",
            "RunEnd",
            "RunStart",
            "SampleGpu",
            "SampleHost",
            "Snapshot",
            "Step",
            "Tick",
        )
    },
}


def __getattr__(name: str) -> Any:
    if name == "records":
        value: Any = _records_module()
    elif name == "money":
        value = _money_module()
    elif name in _LAZY:
        value = getattr(_LAZY[name](), name)
    else:
        raise AttributeError(f"module 'trainmeter_core.api' has no attribute {name!r}")
    globals()[name] = value  # resolved once: the next access is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
