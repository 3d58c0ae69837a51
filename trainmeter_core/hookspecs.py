"""Every extension point of trainmeter: one function each, whose docstring is its documentation.

A plugin is a module (or object) named by an entry point of the group ``trainmeter`` (loaded by tm's own processes)
or ``trainmeter.agent`` (loaded inside the training process, for tracker taps only). It implements any of the hooks
below with ``hookimpl``, and imports nothing of tm but ``trainmeter_core.api``, which holds the Protocol each hook's
answer follows, the helpers and the record types. tm's built-in pieces register through the same hooks.

tm calls each plugin's implementation on its own (a plugin that raises is reported by ``tm plugins`` and skipped) and
reads the answers in the order the plugins were loaded: where two plugins offer the same name, the first one wins.
"""

from __future__ import annotations

# Every name an annotation uses is imported at run time: typing.get_type_hints finds each hook's Protocol in them.
import argparse
from collections.abc import Sequence
from pathlib import Path

import pluggy

from trainmeter_core.api import (
    AlertRule,
    BusComponent,
    Command,
    PlatformAdapter,
    ProfilerImporter,
    Sink,
    TrackerTap,
)
from trainmeter_core.hookmarker import PROJECT, hookimpl

__all__ = ["PROJECT", "hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker(PROJECT)

# ---------------------------------------------------------------------------------------------------------------------
# Components: what lives on the bus


@hookspec
def trainmeter_components() -> Sequence[type[BusComponent]]:
    """Bus components this plugin provides: anything that reads records from the bus or publishes its own.

    Protocol: :class:`trainmeter_core.api.BusComponent` (``name``, ``subscribes``, ``run(ctx)``).

    :return: the component classes (not instances); tm builds each with no arguments. An empty list starts nothing.

    Called in tm's launcher when a run starts, after the training process started, to place each component: tm's
    built-in pure-Python components share one ``components`` process as threads, every plugin's component gets a
    process of its own. Called again in that process to find the class by its ``name``. ``ctx`` (a
    :class:`trainmeter_core.api.ComponentContext`) publishes, reads the subscribed kinds, and holds the run's
    ``meta.json`` and directory. A component that raises is restarted with backoff and a ``component`` record says so.

    Example::

        from trainmeter_core.api import BusComponent, Notice, hookimpl


        class StepCounter(BusComponent):
            name = "step-counter"
            subscribes = ("step",)

            def run(self, ctx):
                steps = sum(1 for _ in ctx.records(timeout_s=0.5))  # until tm stops the component
                ctx.publish(Notice(level="info", topic="step-counter", message=f"{steps} steps seen"))


        @hookimpl
        def trainmeter_components():
            return [StepCounter]
    """


@hookspec
def trainmeter_sinks() -> Sequence[type[Sink]]:
    """Sinks: components that consume records (alerts, snapshots) and deliver them somewhere (a file, a webhook).

    Protocol: :class:`trainmeter_core.api.Sink`, a :class:`trainmeter_core.api.BusComponent` with a sink's rules: never
    block, retry with backoff and give up with one ``notice``, drop rather than queue without bound, and send nothing
    off the node unless the user configured a destination.

    :return: the sink classes, as for :func:`trainmeter_components`. Return an empty list while the sink has nothing
        to do (no destination configured): tm then starts no process for it.

    Called where :func:`trainmeter_components` is, and placed the same way (a plugin's sink gets its own process).
    :func:`trainmeter_core.api.alerts_until_stopped` yields every alert of the run once: those raised before the sink
    subscribed (it starts after the training, late on a busy machine) from the run log, then the bus's, then those of
    the final snapshot, which come after the run's end. A resumed run's sink does not get the earlier attempts'
    alerts again, nor does a sink tm restarted after a crash get those logged before its crash.

    Example::

        import sys

        from trainmeter_core.api import Sink, alerts_until_stopped, hookimpl


        class AlertsToStdout(Sink):
            name = "alerts-to-stdout"
            subscribes = ("alert",)

            def run(self, ctx):
                for alert in alerts_until_stopped(ctx):
                    print(f"{alert.rule} {alert.state}: {alert.message}", file=sys.stdout, flush=True)


        @hookimpl
        def trainmeter_sinks():
            return [AlertsToStdout]
    """


@hookspec
def trainmeter_alert_rules() -> Sequence[AlertRule]:
    """Alert rules: pure functions over the engine's snapshots.

    Protocol: :class:`trainmeter_core.api.AlertRule` (``name``, ``severity``, ``defaults``,
    ``evaluate(state, snapshot) -> Verdict``), answering with :class:`trainmeter_core.api.Verdict` and
    :class:`trainmeter_core.api.Condition`.

    :return: rule instances. A rule without a ``name`` or ``evaluate``, or whose name another plugin took first, is
        refused with one line.

    Called once, when the ``alerts`` component starts (a thread of tm's shared ``components`` process). Thresholds
    come from the rule's ``defaults``, overridden by ``[alerts.<name>]`` of the run's ``tm.toml``. Time comes only
    from the snapshots (one a second, after the hub's ``tick``), so a rule sees time pass while no step arrives. The
    alerts component turns verdicts into ``alert`` records: fired once per episode after ``fire_after_s``, cleared
    after ``clear_after_s`` without the condition, flapping damped by doubling that wait.

    Example::

        from trainmeter_core.api import AlertRule, Condition, Verdict, hookimpl, metric


        class SlowSteps(AlertRule):
            name = "slow_steps"
            severity = "warning"
            defaults = {"max_step_s": 5.0, "fire_after_s": 60.0}

            def evaluate(self, state, snapshot):
                median_s = metric(snapshot, "step_time_median_s")
                if median_s is None:
                    return Verdict(held=True)  # cannot judge yet: episodes stay as they are
                numbers = {"step_time_median_s": median_s}
                if median_s > state.config["max_step_s"]:
                    return Verdict(active=[Condition(f"steps take {median_s:.1f} s", numbers)])
                return Verdict(normal=[Condition(f"steps take {median_s:.1f} s again", numbers)])


        @hookimpl
        def trainmeter_alert_rules():
            return [SlowSteps()]
    """


# ---------------------------------------------------------------------------------------------------------------------
# Machines


@hookspec
def trainmeter_platform_adapters() -> dict[str, type[PlatformAdapter]]:
    """Platform adapters by name: classes that turn what NVML offers on one kind of machine into the row schema.

    Protocol: :class:`trainmeter_core.api.PlatformAdapter` (``name``, ``not_offered``, ``offers(field)``,
    ``adapt(reading)``), filling a :class:`trainmeter_core.api.GpuReading`.

    :return: ``{name: AdapterClass}``. The first plugin to name an adapter wins.

    Called when the GPU sampler starts, in its own process (NVML calls can hang), and by ``tm doctor``. The sampler
    builds the class with no arguments once per GPU whose device spec names it (``"adapter": "<name>"``, see
    :func:`trainmeter_device_specs`) and calls ``adapt`` after each sample's NVML reads; a GPU without a spec, or whose
    spec names an adapter no plugin provides, gets ``server``, which passes NVML through (``tm doctor`` says so).
    Every measured field of a row (:data:`trainmeter_core.api.MEASURED_FIELDS`) ends up a value or absent with its
    reason, never a zero standing for "unknown".

    Example::

        from trainmeter_core.api import NOT_ON_THIS_DEVICE, PlatformAdapter, hookimpl


        class NoPcie(PlatformAdapter):
            name = "no-pcie"
            not_offered = {
                "pcie_tx_bps": f"{NOT_ON_THIS_DEVICE}: the GPU sits on the CPU's package",
                "pcie_rx_bps": f"{NOT_ON_THIS_DEVICE}: the GPU sits on the CPU's package",
            }

            def adapt(self, reading):
                try:  # this machine's GPU temperature is a thermal zone of the kernel
                    with open("/sys/class/thermal/thermal_zone0/temp", encoding="ascii") as zone:
                        reading.put("temp_c", int(zone.read()) / 1000)  # the file holds millidegrees
                except (OSError, ValueError) as exc:
                    reading.miss("temp_c", f"thermal zone not readable: {exc}")


        @hookimpl
        def trainmeter_platform_adapters():
            return {NoPcie.name: NoPcie}
    """


@hookspec
def trainmeter_device_specs() -> Sequence[Path]:
    """Extra device spec files (or folders of them) this plugin ships: the datasheet figures of a GPU.

    Protocol: none; the answer is paths. Each is a JSON file in the layout of ``docs/specs.md``, validated like the
    built-in ones: every figure cites the datasheet words it comes from, and a figure no datasheet gives is ``null``
    with a note. ``"adapter"`` in a spec names the :func:`trainmeter_platform_adapters` adapter of that GPU.

    :return: paths of spec files or of folders holding them.

    Called when the GPU sampler starts (in its own process) and by ``tm doctor``. A spec whose id clashes with another
    is an error naming both files, and then no GPU gets a peak (a wrong card's peak is worse than none).

    Example::

        from pathlib import Path

        from trainmeter_core.api import hookimpl


        @hookimpl
        def trainmeter_device_specs():
            return [Path(__file__).resolve().parent / "specs"]  # a folder of spec files shipped in the package
    """


# ---------------------------------------------------------------------------------------------------------------------
# Inside the training process (entry point group ``trainmeter.agent``)


@hookspec
def trainmeter_trackers() -> Sequence[TrackerTap]:
    """Tracker taps: in-process readers of a logging library's calls (wandb, TensorBoard, MLflow).

    Protocol: :class:`trainmeter_core.api.TrackerTap` (``name``, ``module``, ``attach(module, emit)``), handing values
    to a :class:`trainmeter_core.api.TapEmit`.

    :return: tap instances.

    Called inside the training process, by the agent, when the user's code first imports a tracker library. Register
    the plugin under the entry point group ``trainmeter.agent``, never ``trainmeter``: tm's launcher lists that group
    once per run, and the agent loads the listed plugins and calls this hook on each of them itself, without pluggy
    (the ``hookimpl`` options are not read there). So the module behind the entry point must import nothing heavy:
    ``trainmeter_core.api`` and the standard library only. Name the entry point after the library's module
    (``aim = "tm_aim.plugin"``): the agent watches for the import of each listed name, and of the built-in trackers,
    to load the plugins (the list is read once ``torch`` is imported). Each tap then attaches when its ``module`` is
    imported; a tap that fails stops itself only.

    Example::

        from trainmeter_core.api import TrackerTap, hookimpl


        class PrintLoggerTap(TrackerTap):
            name = "printlogger"
            module = "printlogger"  # a library with log(key, value, step=None)

            def attach(self, module, emit):
                original = module.log

                def log(key, value, step=None):
                    result = original(key, value, step)
                    emit({key: value}, step)
                    return result

                module.log = log


        @hookimpl
        def trainmeter_trackers():
            return [PrintLoggerTap()]
    """


# ---------------------------------------------------------------------------------------------------------------------
# Importers and commands


@hookspec
def trainmeter_profiler_importers() -> Sequence[ProfilerImporter]:
    """Profiler importers: readers of a profiler's result file into ``profile.import`` records.

    Protocol: :class:`trainmeter_core.api.ProfilerImporter` (``name``, ``can_read(path) -> bool``, a streaming
    ``read(path, run) -> Iterator[Record]``), yielding :class:`trainmeter_core.api.ProfileImport` records.

    :return: importer instances.

    Called by ``tm import`` and by the launcher at the end of a run, in tm's own process, with the run's ``meta.json``
    as ``run``; each file goes to the first importer whose ``can_read`` says yes (tm's own ``kineto`` reads
    torch.profiler's Chrome traces). Traces reach hundreds of MB: read them as a stream, in bounded memory, into a
    :class:`trainmeter_core.api.ProfileBuilder`, which answers the records. A plugin whose hook raises is reported
    and skipped; an importer that raises on a file refuses that file (``ValueError``: one line, nothing written).

    Example::

        import json

        from trainmeter_core.api import ProfileBuilder, ProfilerImporter, hookimpl


        class KernelLines(ProfilerImporter):
            # GPU kernels as JSON lines: {"name": ..., "start_ns": ..., "end_ns": ..., "stream": ...}, in Unix time.
            name = "kernel-lines"

            def can_read(self, path):
                return path.name.endswith(".kernels.jsonl")

            def read(self, path, run):
                builder = ProfileBuilder(time_unit_s=1e-9)  # the classes, windows and split are tm's
                with open(path, encoding="utf-8") as lines:
                    for line in lines:  # a line at a time: never the whole file
                        kernel = json.loads(line)
                        builder.add_kernel(
                            kernel["start_ns"], kernel["end_ns"], kernel["name"], stream=kernel.get("stream")
                        )
                yield from builder.records(
                    importer=self.name,
                    file=str(path),
                    profiler="kernel-lines",
                    trace_id=path.name,
                    wall_offset_s=0.0,  # its times are Unix times already
                    host=run.get("host", ""),
                )


        @hookimpl
        def trainmeter_profiler_importers():
            return [KernelLines()]
    """


@hookspec
def trainmeter_commands() -> Sequence[Command]:
    """Extra ``tm`` subcommands: ``tm <name> ...``.

    Protocol: :class:`trainmeter_core.api.Command` (``name``, ``help``, ``add_arguments(parser)``,
    ``run(args) -> int``).

    :return: command instances. A name tm itself has, or an earlier plugin took, is reported and skipped.

    Called in the ``tm`` process when its first word is neither a built-in command nor a script to run. The command
    runs there, after its own ``argparse`` parser read the rest of the line; its return value is tm's exit status.

    Example::

        from trainmeter_core.api import Command, hookimpl


        class Hello(Command):
            name = "hello"
            help = "Say hello."

            def add_arguments(self, parser):
                parser.add_argument("who", nargs="?", default="world")

            def run(self, args):
                print(f"hello, {args.who}")
                return 0


        @hookimpl
        def trainmeter_commands():
            return [Hello()]
    """


@hookspec
def trainmeter_add_options(parser: argparse.ArgumentParser) -> None:
    """Add options to ``tm``'s run command (for example ``--webhook-url``).

    Protocol: none; the hook adds to the parser it is given.

    :param parser: the ``argparse`` parser of ``tm [options] script.py``.
    :return: nothing.

    Called in the ``tm`` process while it reads the command line, only when the line holds an option tm does not
    know. Give each option a ``dest`` that is an environment variable name (``dest="TM_WEBHOOK_URL"``): tm hands its
    value to the components (never to the training process) in that variable, so the flag and the variable are one
    setting. Options that carry secrets must also be named by :func:`trainmeter_secret_options`.

    Example::

        from trainmeter_core.api import hookimpl


        @hookimpl
        def trainmeter_add_options(parser):
            parser.add_argument("--journal-file", dest="TM_JOURNAL_FILE", help="where the journal sink writes")
    """


@hookspec
def trainmeter_secret_options() -> Sequence[str]:
    """Option names (``--webhook-url``) and environment variable names (``TM_WEBHOOK_URL``) whose values are secret.

    Protocol: none; the answer is names.

    :return: option and variable names.

    Called in tm's launcher (and by ``tm attach``) before it writes ``meta.json`` and ``run.start``: the values of
    these names are replaced by ``***`` there, in the dashboard and in every export; tm never writes them to the log.

    Example::

        from trainmeter_core.api import hookimpl


        @hookimpl
        def trainmeter_secret_options():
            return ["--journal-token", "TM_JOURNAL_TOKEN"]
    """
