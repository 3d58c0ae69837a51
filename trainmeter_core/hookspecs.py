"""Every extension point of trainmeter: one function each, with the docstring that is its documentation.

A plugin is a module (or object) registered under the entry point group ``trainmeter`` (loaded by tm's own processes)
or ``trainmeter.agent`` (loaded inside the training process, so it must import nothing heavy). It implements any of the
hooks below with ``from trainmeter_core import hookimpl``. The built-in pieces register the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from pathlib import Path

PROJECT = "trainmeter"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# ---------------------------------------------------------------------------------------------------------------------
# Components: processes and threads that live on the bus


@hookspec
def trainmeter_components() -> Sequence[type]:
    """Bus components this plugin provides.

    Return a list of classes derived from :class:`trainmeter_core.component.Component`. Each has a ``name``, the
    ``subscribes`` kinds it reads, and a ``run(ctx)`` method that loops until ``ctx.stopping`` is set, publishing with
    ``ctx.publish(record)`` and reading with ``ctx.records(timeout_s)``. Built-in pure-Python components run as threads
    of one shared ``components`` process; a third-party plugin's components each get a process of their own, so a
    crash there never takes down another. A crashed process is restarted with backoff and a ``component`` record says
    so.
    """


@hookspec
def trainmeter_sinks() -> Sequence[type]:
    """Sinks: components that consume records (alerts, snapshots) and deliver them somewhere.

    Return Component classes, as for :func:`trainmeter_components`. A sink must never block another component: do
    network I/O with timeouts, retry with backoff, and drop (and say so) rather than queue without bound. Examples:
    the terminal sink (one line per alert on stderr), a webhook, a heartbeat, a Prometheus exporter.
    """


@hookspec
def trainmeter_alert_rules() -> Sequence[Any]:
    """Alert rules: pure functions over the engine's snapshots.

    Return rule objects with a ``name``, a ``severity``, default thresholds (overridable in ``tm.toml`` under
    ``[alerts.<name>]``) and ``evaluate(state, snapshot) -> Verdict``. Time comes only from the snapshots (which follow
    the hub's ``tick``), so a rule sees time pass while no step arrives. The alerts component turns verdicts into
    ``alert`` records (fired once per episode, cleared when the condition ends, with flapping damped).
    """


# ---------------------------------------------------------------------------------------------------------------------
# Machines


@hookspec
def trainmeter_platform_adapters() -> dict[str, type]:
    """Platform adapters by name: classes that turn what NVML offers on one kind of machine into the row schema.

    Return ``{"name": AdapterClass}``. The class derives from :class:`trainmeter_core.platform.PlatformAdapter` and
    is built with no arguments, once per GPU whose device spec names it (``"adapter": "spark"``); a GPU without a spec
    gets ``server``, the built-in adapter that passes NVML through. Two attributes make an adapter:

    - ``not_offered``: ``{field: reason}`` for the fields this kind of machine never has (the GB10 has no memory
      clock, PCIe or NVLink: ``"not on this device"``). The sampler does not ask NVML for them.
    - ``adapt(reading)``: called after each sample's NVML reads with a
      :class:`trainmeter_core.platform.GpuReading`; fill a field with ``reading.put(field, value)`` or say why it is
      missing with ``reading.miss(field, reason)``. It must not raise and must not block (it runs once a second per
      GPU, in the GPU sampler's own process).

    The row schema is :class:`trainmeter_core.records.SampleGpu` (``trainmeter_core.platform.MEASURED_FIELDS``
    lists what a sampler measures); every field ends up a value or in ``absent`` with its reason, never a zero
    standing for "unknown". The first plugin to name an adapter wins; a spec naming an adapter no plugin provides is
    sampled with ``server`` and ``tm doctor`` says so.
    """


@hookspec
def trainmeter_device_specs() -> Sequence[Path]:
    """Extra device spec files (or folders of them) this plugin ships.

    Each is a JSON file in the layout of ``docs/specs.md``, validated like the built-in ones: every figure cites the
    datasheet words it comes from, and a figure no datasheet gives is ``null`` with a note. A spec id that clashes with
    another is an error naming both files.
    """


# ---------------------------------------------------------------------------------------------------------------------
# Inside the training process (entry point group ``trainmeter.agent``)


@hookspec
def trainmeter_trackers() -> Sequence[Any]:
    """Tracker taps: in-process readers of a logging library's calls (wandb, TensorBoard, MLflow).

    Loaded by the agent inside the training process, so the module behind the entry point must import nothing heavy.
    Return tap objects with ``name``, ``module`` (the library module whose import attaches the tap) and
    ``attach(module, emit)``. A tap reads numbers and 0-dimensional CPU tensors only, survives the tracker's internal
    re-calls, and disables only itself on failure. The launcher resolves this group once and hands the list to the
    agent, so ranks never scan package metadata.
    """


# ---------------------------------------------------------------------------------------------------------------------
# Importers and commands


@hookspec
def trainmeter_profiler_importers() -> Sequence[Any]:
    """Profiler importers: readers of a profiler's result file into ``profile.import`` records.

    Return importer objects with ``name``, ``can_read(path) -> bool`` and ``read(path, run) -> Iterable[Record]``.
    Traces reach hundreds of MB: read them as a stream.
    """


@hookspec
def trainmeter_commands() -> Sequence[Any]:
    """Extra ``tm`` subcommands.

    Return command objects with ``name``, ``help``, ``add_arguments(parser)`` and ``run(args) -> int`` (the exit
    status). A command whose name is taken by a built-in or an earlier plugin is reported and skipped.
    """


@hookspec
def trainmeter_add_options(parser: argparse.ArgumentParser) -> None:
    """Add options to ``tm``'s run command (for example ``--webhook-url``).

    Give each option a ``dest`` that is an environment variable name (``dest="TM_WEBHOOK_URL"``): tm hands the
    value to the components (never to the training process) in that variable. Options that carry secrets must also
    be named by :func:`trainmeter_secret_options`, so they are redacted wherever the command line is recorded or shown.
    """


@hookspec
def trainmeter_secret_options() -> Sequence[str]:
    """Option names (``--webhook-url``) and environment variable names (``TM_WEBHOOK_URL``) whose values are secret.

    Their values are replaced by ``***`` in ``meta.json``, ``run.start``, the dashboard and every export; tm never
    writes them to the run log.
    """
