"""The launcher: runs the training command untouched under the hub, the recorder and the components, as one ``Launch``
whose phases read in order (open the run, start the command, watch it, wait for it, end the run). tm exits with the
command's status, and never signals it except to forward a signal tm itself received.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from trainmeter_core.bus.hub import Hub
from trainmeter_core.errors import CommandNotStartable
from trainmeter_core.model import money, records
from trainmeter_core.model.redaction import redact_argv
from trainmeter_core.run import resume as resuming
from trainmeter_core.run.child import (
    AGENT_PLUGIN_NAMES,
    FORWARDED,
    Child,
    child_environment,
    exec_untouched,
    exit_status,
    give_job_windows,
    resolve_command,
)
from trainmeter_core.run.component_start import start_components
from trainmeter_core.run.end_times import EndTimes
from trainmeter_core.run.final_snapshot import final_snapshot, final_with_components
from trainmeter_core.run.goodbyes import lost_windows, may_still_say_bye
from trainmeter_core.run.identity import (
    declared_facts,
    describe_run,
    measured_peak_facts,
    note_child_pid,
    open_run,
    read_job_identity,
    selected_env,
    write_agent_plugins,
)
from trainmeter_core.run.job_join import join_job
from trainmeter_core.run.run_options import RunOptions
from trainmeter_core.run.stderr_lines import Say
from trainmeter_core.run.summary import summary_line, write_passport, write_summary
from trainmeter_core.runlog.recorder import Recorder

AGENT_BYE_WAIT_S = 3.0
#: Components start once the command has run this long (from tm's start): a shorter one never needs them, and they
#: catch up from the log, so a long run loses nothing by the wait.
COMPONENTS_AFTER_S = float(os.environ.get("TM_COMPONENTS_AFTER_S", "0.25"))
# How long the job hub waits for the other nodes' last records, and a node for the job hub's acknowledgement of its own.
JOB_END_WAIT_S = float(os.environ.get("TM_JOB_END_WAIT_S", "10"))


def run(opts: RunOptions) -> int:
    """Run the command under tm and return tm's exit status, the command's own; a ``TmError`` (a run directory that
    cannot be made, a command that cannot start) ends it with one line before the command runs."""
    say = Say(opts.quiet)
    if os.environ.get("TM_ACTIVE") == "1":
        exec_untouched(opts.command, opts.script_mode)  # tm inside tm: the outer one already watches
    if "LOCAL_RANK" in os.environ:
        say(
            "this is a torchrun rank (LOCAL_RANK is set): put tm outside, as `tm -- torchrun ...`",
            always=True,
        )
        exec_untouched(opts.command, opts.script_mode)
    argv = resolve_command(opts.command, opts.script_mode)
    launch = Launch(opts, argv, say)
    launch.start_command()
    launch.watch_command()
    status = launch.wait_for_command()
    return launch.end(status)


class Launch:
    """One run of the command under tm, from its run directory to the summary line; ``run`` calls its phases in order:
    open (the constructor), start the command, watch it, wait for it, end the run.

    Order matters: the run directory and the hub come first, then the child (it inherits tm's file descriptors, and
    gets the terminal's foreground when tm has it), then tm lowers its own priority and starts its components, which
    catch up from the log: once the command has run 0.25 s, so that a short command that ends cleanly never pays for
    them, and the end of a run waits only for what is pending (a goodbye from a live process, a snapshot someone
    listens for). Only tm's own writes are guarded against a closed pipe.
    """

    def __init__(self, opts: RunOptions, argv: list[str], say: Say) -> None:
        self.opts = opts
        self.say = say
        self.name = opts.name or Path(opts.command[0]).stem or "run"
        self.target = resuming.target_for(opts, self.name, say)
        self.attempt = self.target.attempt if self.target is not None else 1
        self.start_wall = time.time()
        self.start_t = time.monotonic()
        self.after_seq, after_tick = self._open_run_dir()
        self.recorder = Recorder(self.run_dir, warn=say, first_segment=max(1, self.first_segment))
        self.recorder.start()
        # Each agent's step page lies beside the sockets: tmpfs where they are, and removed with them.
        self.step_pages = self.sockets.path / "pages"
        self.step_pages.mkdir(exist_ok=True)
        environment = child_environment(self.endpoints, self.run_dir, opts.agent, opts.tap, self.step_pages)
        self.child = Child(argv, environment)
        self.hub = Hub(
            self.endpoints["in"],
            self.endpoints["out"],
            self.recorder,
            child_alive=self.child.alive,
            after_seq=self.after_seq,
            after_tick=after_tick,
        )
        self.plan = None if opts.no_job else join_job(opts, self.hub, self.run_dir, say)
        if self.plan is not None:
            give_job_windows(environment)  # the Child's own dict: the command starts with it later
        self.hub.start()
        self.slurm = "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" in os.environ
        self.plugins = None
        self.supervisor = None
        self.watch_stop = threading.Event()
        self.previous_handlers: dict = {}

    def _open_run_dir(self) -> tuple[int, int]:
        """A new run directory, or the resumed run's reopened; returns where its log ends (sequence number, tick)."""
        if self.target is None:
            self.run_dir, self.lock, self.sockets, self.endpoints = open_run(
                self.name, self.opts.runs_dir, self.start_wall
            )
            self.first_segment = 0
            return 0, 0
        reopened = resuming.reopen(self.target)
        self.run_dir, self.lock, self.sockets, self.endpoints = (
            reopened.run_dir,
            reopened.lock,
            reopened.sockets,
            reopened.endpoints,
        )
        self.name = self.target.name
        self.first_segment = reopened.end.next_segment
        return reopened.end.last_seq, reopened.end.last_tick

    # -- starting the command

    def start_command(self) -> None:
        """Start the command, signals forwarded to it; a resumed attempt is announced first. A command that cannot
        start ends the run (status 126 or 127) and raises ``CommandNotStartable``."""
        if self.target is not None:
            self._announce_resumed_attempt()
        # Before the command: its agent reads the names once, at its start (from the environment: no JSON to import).
        self.child.env[AGENT_PLUGIN_NAMES] = "\n".join(write_agent_plugins(self.run_dir))
        self.previous_handlers = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        argv0 = self.child.argv[0]
        try:
            self.child.start()
        except FileNotFoundError:
            self._abandon(127, "not_found")
            raise CommandNotStartable.not_found(f"{argv0}: command not found") from None
        except PermissionError:
            self._abandon(126, "not_executable")
            raise CommandNotStartable.not_executable(f"{argv0}: not executable") from None

    def _announce_resumed_attempt(self) -> None:
        """A resumed attempt's run.start comes first in its part of the log, before anything its command sends, so
        the engine knows which attempt every later record belongs to; that costs its command the plugins' load."""
        self.plugins = load_plugins(self.say)
        self._announce(None)
        # ... and on disk before any component reads the log: a reader of the log's end must never take the segment
        # just opened, still empty, for the end of the attempt before (which may end with run.end).
        deadline = time.monotonic() + 5.0
        while (self.recorder.queued_seq or 0) <= self.after_seq and time.monotonic() < deadline:
            time.sleep(0.002)
        self.recorder.flush(5.0)

    def _forward(self, signum: int, _frame) -> None:
        if (
            not self.slurm
        ):  # Slurm already signals every process of the step: forwarding would deliver it twice
            self.child.signal(signum)

    def _announce(self, child_pid: int | None) -> None:
        """``meta.json`` and the ``run.start`` record, the command and environment redacted by the plugins' names."""
        secret_names = [n for _, names in self.plugins.per_plugin("trainmeter_secret_options") for n in names]
        start = describe_run(
            self.run_dir,
            name=self.name,
            command=redact_argv(self.opts.command, secret_names),
            cwd=os.getcwd(),
            start_wall=self.start_wall,
            start_t=self.start_t,
            child_pid=child_pid,
            env=selected_env(secret_names),
            plugins=self.plugins.infos,
            source="launcher",
            script_mode=self.opts.script_mode,
            agent=self.opts.agent,
            slurm=self.slurm,
            job=self.plan.place if self.plan is not None else None,
            job_identity=read_job_identity(),
            attempt=self.attempt,
            resume_reason=self.target.reason if self.target is not None else None,
        )
        if child_pid is None:
            start.absent = {
                **start.absent,
                "child_pid": "run.start of a resumed attempt comes before its command",
            }
        self.hub.inject(start)

    def _abandon(self, status: int, reason: str) -> None:
        """End the run whose command never started: its run.end, its summary, its lock and sockets released."""
        self.hub.finish(
            records.RunEnd(
                status=status, reason=reason, elapsed_s=time.monotonic() - self.start_t, source="launcher"
            )
        )
        self.recorder.close()
        write_summary(
            self.run_dir,
            self.hub,
            self.recorder,
            status,
            reason,
            None,
            None,
            time.monotonic() - self.start_t,
            None,
        )
        self.lock.release()
        self.sockets.remove()

    # -- watching it

    def watch_command(self) -> None:
        """Describe the started command, then start the components, unless it is already over, and cleanly."""
        if self.plugins is None:
            # Plugins load after the child started: importing them costs ms the training need not wait for.
            self.plugins = load_plugins(self.say)
            self._announce(self.child.pid)
        else:
            note_child_pid(self.run_dir, self.child.pid)
        for fact in declared_facts(self.opts.declared) + measured_peak_facts(self.opts.declared):
            self.hub.inject(fact)
        from trainmeter_core.runlog import replay  # noqa: F401 (the end of a short run needs it: load it while we wait)

        early = self.child.exited_within(COMPONENTS_AFTER_S - (time.monotonic() - self.start_t))
        if early is not None and exit_status(early)[0] == 0 and self.plan is None:
            # The command is over already, and cleanly: nothing is left for a component to watch or alert about, and
            # starting them would only delay the end; the launcher computes the final snapshot itself. A failed
            # command still gets them (its died alert needs them), and so does a node of a job (its other nodes may
            # still run).
            self.say(f"run {self.run_dir.name} in {self.run_dir.parent}")
        else:
            self.supervisor = start_components(
                self.opts, self.plugins, self.hub, self.child, self.run_dir, self.say, self.watch_stop
            )

    # -- waiting for it

    def wait_for_command(self) -> int:
        """The command's raw wait status, once it exited and the records still on their way have come."""
        status = self.child.wait()
        self.watch_stop.set()
        self._wait_for_goodbyes()
        if self.hub.job is not None:
            # The job hub's run ends after the other nodes' (DDP ranks end together): let their last records come.
            deadline = time.monotonic() + JOB_END_WAIT_S
            while self.hub.job.open_nodes() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._import_profiles()
        return status

    def _wait_for_goodbyes(self) -> None:
        """Let every agent say goodbye (its bye carries its final drop count), but never for long, and not at all once
        its process is gone: a killed process says nothing more."""
        deadline = time.monotonic() + AGENT_BYE_WAIT_S
        while (
            any(may_still_say_bye(key) for key in list(self.hub.open_producers))
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)

    def _import_profiles(self) -> None:
        """The traces torch.profiler wrote during the run go in before run.end, so the final numbers hold them; the
        step records they are aligned with must be in the log first."""
        profile_dirs = list(dict.fromkeys([*self.opts.profile_dirs, *self.hub.profiler_dirs]))
        if not profile_dirs:
            return
        from trainmeter_core.run.profile_import import import_at_end

        self.recorder.flush(2.0)
        try:
            import_at_end(
                self.run_dir, profile_dirs, self.hub.inject, self.plugins, self.start_wall, self.say
            )
        except Exception as exc:  # the run's end must go on whatever an importer does
            self.say(f"profiler traces not imported: {type(exc).__name__}: {exc}")

    # -- ending the run

    def end(self, status: int) -> int:
        """run.end, the final snapshot, the summary, the passport and the summary line; returns tm's exit status."""
        tm_status, reason, code, sig = exit_status(status)
        elapsed_s = time.monotonic() - self.start_t
        end = records.RunEnd(
            status=tm_status,
            reason=reason,  # type: ignore[arg-type]
            exit_code=code,
            signal=sig,
            signal_name=signal.Signals(sig).name if sig else None,
            elapsed_s=elapsed_s,
            steps=self.hub.steps,
            source="launcher",
        )
        # summary.json's tm_end_s: what tm's own end takes, which a scheduler's kill waits for
        times = EndTimes()
        with times.stage("run.end"):
            self.hub.end(
                end,
                before_end=lambda open_producers: lost_windows(
                    open_producers, self.say, self.step_pages, self.hub.producer_steps, self.child.env
                ),
            )
        if self.hub.forwarder is not None:
            with times.stage("forwarding to the job hub"):
                self._finish_forwarding()
        snapshot = self._stop(tm_status, times)
        summary = write_summary(
            self.run_dir,
            self.hub,
            self.recorder,
            tm_status,
            reason,
            code,
            sig,
            elapsed_s,
            self.start_wall,
            snapshot,
            attempt=self.attempt,
            end_s=times.seconds,
        )
        slow = times.slow_line()
        if slow is not None:
            self.say(slow)
        write_passport(self.run_dir, snapshot, self.say)
        # The price the run was given (handed to the components alone) prices the end's line: printed, never stored.
        price = money.from_environ(self.opts.component_env)
        self.say(summary_line(self.run_dir, summary, snapshot, price), always=True)
        self.lock.release()
        self.sockets.remove()
        return tm_status

    def _finish_forwarding(self) -> None:
        """A node of a job: its records reach the job hub, or one line says how many did not."""
        forwarder = self.hub.forwarder
        if forwarder is not None and not forwarder.finish(JOB_END_WAIT_S):
            self.say(
                f"{forwarder.pending()} records did not reach the job hub at {forwarder.endpoint} "
                f"({forwarder.overflowed} fell out of the resend buffer); this node's run log has them all",
                always=True,
            )

    def _stop(self, tm_status: int, times: EndTimes) -> records.Snapshot | None:
        """Stop the components, the hub and the recorder, give the signals back; returns the final snapshot. Each
        stage's time goes into ``times``; a component process killed for not stopping is said."""
        snapshot = None
        if self.supervisor is not None:
            snapshot = final_with_components(
                self.supervisor, self.hub, self.recorder, self.run_dir, self.say, tm_status, times
            )
            with times.stage("components"):
                for line in self.supervisor.stop():
                    self.say(line, always=True)
        with times.stage("hub"):
            self.hub.stop()
        with times.stage("recorder"):
            self.recorder.close()
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)
        if snapshot is None:
            with times.stage("final snapshot"):
                snapshot = final_snapshot(self.run_dir, self.hub, self.say)
        return snapshot


def load_plugins(say: Say):
    """tm's plugins, a line for each that did not load."""
    from trainmeter_core import plugins as plugins_mod

    plugins = plugins_mod.load()
    for info in plugins.errors():
        say(f"plugin {info.name} ({info.distribution or 'unknown distribution'}) not loaded: {info.error}")
    return plugins
