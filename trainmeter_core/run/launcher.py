"""The launcher: runs the training command untouched under the hub, the recorder and the component supervisor.

Order matters: the run directory and the hub come first, then the child (it inherits tm's file descriptors, and gets
the terminal's foreground when tm has it), then tm lowers its own priority and starts its components, which catch up
from the log: once the command has run 0.25 s, so that a short command that ends cleanly never pays for them, and the
end of a run waits only for what is pending (a goodbye from a live process, a snapshot someone listens for). tm exits
with the child's status. Only tm's own writes are guarded against a closed pipe; nothing here
ever signals the child except to forward a signal tm itself received.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainmeter_core.bus.hub import Hub
from trainmeter_core.model import records as rec
from trainmeter_core.model.redaction import redact_argv
from trainmeter_core.run import job as job_mod
from trainmeter_core.run import resume as resuming
from trainmeter_core.run.child import (
    AGENT_PLUGIN_NAMES,
    FORWARDED,
    Child,
    agent_boot_dir,
    child_environment,
    exec_untouched,
    exit_status,
    lower_own_priority,
    resolve_command,
)
from trainmeter_core.run.end import (
    final_snapshot,
    final_with_components,
    lost_windows,
    may_still_say_bye,
    summary_line,
    write_passport,
    write_summary,
)
from trainmeter_core.run.identity import (
    declared_facts,
    describe_run,
    measured_peak_facts,
    note_child_pid,
    open_run,
    selected_env,
    write_agent_plugins,
)
from trainmeter_core.run.say import Say
from trainmeter_core.runlog.recorder import Recorder

if TYPE_CHECKING:
    from trainmeter_core.bus.supervisor import Placement

AGENT_BYE_WAIT_S = 3.0
#: Components start once the command has run this long (from tm's start): a shorter one never needs them, and they
#: catch up from the log, so a long run loses nothing by the wait.
COMPONENTS_AFTER_S = float(os.environ.get("TM_COMPONENTS_AFTER_S", "0.25"))
# How long the job hub waits for the other nodes' last records, and a node for the job hub's acknowledgement of its own.
JOB_END_WAIT_S = float(os.environ.get("TM_JOB_END_WAIT_S", "10"))


@dataclass
class RunOptions:
    command: list[str]
    script_mode: bool
    name: str | None = None
    runs_dir: str | None = None
    agent: bool = True
    quiet: bool = False
    gpus: str | None = None
    tap: bool = True
    web: bool = True
    host: str = "127.0.0.1"
    port: int | None = None
    declared: dict = field(default_factory=dict)  # name -> declared.Declared
    component_env: dict = field(
        default_factory=dict
    )  # plugin options and --heartbeat, for the components only
    profile_dirs: list = field(default_factory=list)  # --profile-dir: traces to import at the end
    job: str | None = None  # --job HOST:PORT, --node-rank, --nnodes, --job-keys, --no-job (run/job.py)
    node_rank: int | None = None
    nnodes: int | None = None
    job_keys: str | None = None
    no_job: bool = False
    resume: str | None = None  # --resume RUN: continue that run as its next attempt
    new_run: bool = False  # --new-run: never continue a run whose checkpoint the command names


def plan_placements(plugins) -> list[Placement]:
    """Built-in shared components run as threads of one process; the rest each get their own process.

    ``TM_OWN_PROCESS=name,name`` moves named built-ins into processes of their own (a placement, not a code change).
    """
    from trainmeter_core.bus.supervisor import Placement

    own = {n for n in os.environ.get("TM_OWN_PROCESS", "").split(",") if n}
    disabled = {n for n in os.environ.get("TM_DISABLE_COMPONENTS", "").split(",") if n}
    shared: list[str] = []
    placements: list[Placement] = []
    seen: set[str] = set()
    for hook in ("trainmeter_components", "trainmeter_sinks"):
        for plugin_name, classes in plugins.per_plugin(hook):
            for cls in classes:
                name = getattr(cls, "name", "")
                if not name or name in seen or name in disabled:
                    continue
                seen.add(name)
                if plugin_name in plugins.builtin and getattr(cls, "shared", False) and name not in own:
                    shared.append(name)
                else:
                    placements.append(Placement(process=name, components=[name]))
    if shared:
        placements.insert(0, Placement(process="components", components=shared))
    return placements


def run(opts: RunOptions) -> int:
    say = Say(opts.quiet)
    if os.environ.get("TM_ACTIVE") == "1":
        return exec_untouched(opts.command, opts.script_mode)  # tm inside tm: the outer one already watches
    if "LOCAL_RANK" in os.environ:
        say(
            "this is a torchrun rank (LOCAL_RANK is set): put tm outside, as `tm -- torchrun ...`",
            always=True,
        )
        return exec_untouched(opts.command, opts.script_mode)
    argv = resolve_command(opts.command, opts.script_mode, say)
    if isinstance(argv, int):
        return argv

    name = opts.name or Path(opts.command[0]).stem or "run"
    target = resume_target(opts, name, say)
    if isinstance(target, int):
        return target
    start_wall = time.time()
    start_t = time.monotonic()
    first_segment = after_seq = after_tick = 0
    if target is not None:
        reopened = resuming.reopen(target, say)
        if isinstance(reopened, int):
            return reopened
        run_dir, lock, sockets, endpoints = (
            reopened.run_dir,
            reopened.lock,
            reopened.sockets,
            reopened.endpoints,
        )
        name = target.name
        first_segment, after_seq, after_tick = (
            reopened.end.next_segment,
            reopened.end.last_seq,
            reopened.end.last_tick,
        )
    else:
        opened = open_run(name, opts.runs_dir, start_wall, say)
        if isinstance(opened, int):
            return opened
        run_dir, lock, sockets, endpoints = opened

    recorder = Recorder(run_dir, warn=say, first_segment=max(1, first_segment))
    recorder.start()
    child = Child(argv, child_environment(endpoints, run_dir, opts.agent, opts.tap))
    hub = Hub(
        endpoints["in"],
        endpoints["out"],
        recorder,
        child_alive=child.alive,
        after_seq=after_seq,
        after_tick=after_tick,
    )
    plan = None if opts.no_job else join_job(opts, hub, run_dir, say)
    hub.start()

    slurm = "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" in os.environ
    received: list[int] = []

    def forward(signum: int, _frame) -> None:
        received.append(signum)
        if not slurm:  # Slurm already signals every process of the step: forwarding would deliver it twice
            child.signal(signum)

    def announce(plugins, child_pid: int | None) -> None:
        secret_names = [n for _, names in plugins.per_plugin("trainmeter_secret_options") for n in names]
        start = describe_run(
            run_dir,
            name=name,
            command=redact_argv(opts.command, secret_names),
            cwd=os.getcwd(),
            start_wall=start_wall,
            start_t=start_t,
            child_pid=child_pid,
            env=selected_env(secret_names),
            plugins=plugins.infos,
            source="launcher",
            script_mode=opts.script_mode,
            agent=opts.agent,
            slurm=slurm,
            job=plan.place if plan is not None else None,
            attempt=target.attempt if target is not None else 1,
            resume_reason=target.reason if target is not None else None,
        )
        if child_pid is None:
            start.absent = {
                **start.absent,
                "child_pid": "run.start of a resumed attempt comes before its command",
            }
        hub.inject(start)

    from trainmeter_core import plugins as plugins_mod

    plugins = None
    if target is not None:
        # A resumed attempt's run.start comes first in its part of the log, before anything its command sends, so
        # the engine knows which attempt every later record belongs to; that costs its command the plugins' load.
        plugins = load_plugins(plugins_mod, say)
        announce(plugins, None)
        # ... and on disk before any component reads the log: a reader of the log's end must never take the segment
        # just opened, still empty, for the end of the attempt before (which may end with run.end).
        deadline = time.monotonic() + 5.0
        while (recorder.queued_seq or 0) <= after_seq and time.monotonic() < deadline:
            time.sleep(0.002)
        recorder.flush(5.0)
    # Before the command: its agent reads the names once, at its start (from the environment: no JSON to import).
    child.env[AGENT_PLUGIN_NAMES] = "\n".join(write_agent_plugins(run_dir))
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        child.start()
    except FileNotFoundError:
        say(f"{argv[0]}: command not found", always=True)
        return _abandon(hub, recorder, lock, sockets, run_dir, 127, "not_found", start_t)
    except PermissionError:
        say(f"{argv[0]}: not executable", always=True)
        return _abandon(hub, recorder, lock, sockets, run_dir, 126, "not_executable", start_t)

    if plugins is None:
        # Plugins load after the child started: importing them costs ms the training need not wait for.
        plugins = load_plugins(plugins_mod, say)
        announce(plugins, child.pid)
    else:
        note_child_pid(run_dir, child.pid)
    for fact in declared_facts(opts.declared) + measured_peak_facts(opts.declared):
        hub.inject(fact)
    watch_stop = threading.Event()
    supervisor = None
    from trainmeter_core.runlog import replay  # noqa: F401 (the end of a short run needs it: load it while we wait)

    early = child.exited_within(COMPONENTS_AFTER_S - (time.monotonic() - start_t))
    if early is not None and exit_status(early)[0] == 0 and plan is None:
        # The command is over already, and cleanly: nothing is left for a component to watch or alert about, and
        # starting them would only delay the end; the launcher computes the final snapshot itself. A failed command
        # still gets them (its died alert needs them), and so does a node of a job (its other nodes may still run).
        say(f"run {run_dir.name} in {run_dir.parent}")
    else:
        supervisor = start_components(opts, plugins, hub, child, run_dir, say, watch_stop)

    status = child.wait()
    watch_stop.set()
    tm_status, reason, code, sig = exit_status(status)
    # Let every agent say goodbye (its bye carries its final drop count), but never for long, and not at all once its
    # process is gone: a killed process says nothing more.
    deadline = time.monotonic() + AGENT_BYE_WAIT_S
    while any(may_still_say_bye(key) for key in list(hub.open_producers)) and time.monotonic() < deadline:
        time.sleep(0.02)
    if hub.job is not None:
        # The job hub's run ends after the other nodes' (DDP ranks end together): let their last records come.
        deadline = time.monotonic() + JOB_END_WAIT_S
        while hub.job.open_nodes() and time.monotonic() < deadline:
            time.sleep(0.05)
    profile_dirs = list(dict.fromkeys([*opts.profile_dirs, *hub.profiler_dirs]))
    if profile_dirs:
        # The traces torch.profiler wrote during the run go in before run.end, so the final numbers hold them; the
        # step records they are aligned with must be in the log first.
        from trainmeter_core.run.importing import import_at_end

        recorder.flush(2.0)
        try:
            import_at_end(run_dir, profile_dirs, hub.inject, plugins, start_wall, say)
        except Exception as exc:  # the run's end must go on whatever an importer does
            say(f"profiler traces not imported: {type(exc).__name__}: {exc}")
    elapsed_s = time.monotonic() - start_t
    hub.end(
        rec.RunEnd(
            status=tm_status,
            reason=reason,  # type: ignore[arg-type]
            exit_code=code,
            signal=sig,
            signal_name=signal.Signals(sig).name if sig else None,
            elapsed_s=elapsed_s,
            steps=hub.steps,
            source="launcher",
        ),
        before_end=lambda open_producers: lost_windows(open_producers, say),
    )
    if hub.forwarder is not None and not hub.forwarder.finish(JOB_END_WAIT_S):
        forwarder = hub.forwarder
        say(
            f"{forwarder.pending()} records did not reach the job hub at {forwarder.endpoint} "
            f"({forwarder.overflowed} fell out of the resend buffer); this node's run log has them all",
            always=True,
        )
    snapshot = None
    if supervisor is not None:
        snapshot = final_with_components(supervisor, hub, recorder, run_dir, say, tm_status)
        supervisor.stop()
    hub.stop()
    recorder.close()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if snapshot is None:
        snapshot = final_snapshot(run_dir, hub, say)
    summary = write_summary(
        run_dir,
        hub,
        recorder,
        tm_status,
        reason,
        code,
        sig,
        elapsed_s,
        start_wall,
        snapshot,
        attempt=target.attempt if target is not None else 1,
    )
    write_passport(run_dir, snapshot, say)
    say(summary_line(run_dir, summary, snapshot), always=True)
    lock.release()
    sockets.remove()
    return tm_status


def start_components(opts: RunOptions, plugins, hub: Hub, child: Child, run_dir: Path, say: Say, watch_stop):
    """The silence watch, the web port and the component processes, for a command that is still running (or failed)."""
    from trainmeter_core.bus.supervisor import Supervisor
    from trainmeter_core.run import webport

    if opts.agent:
        watch_silence(child, hub, say, watch_stop)
    if opts.gpus:
        os.environ["TM_GPUS"] = opts.gpus  # the components inherit it; the child already started without it
    os.environ.update(opts.component_env)  # likewise: secrets such as a webhook URL never reach the training
    lower_own_priority()
    placements = plan_placements(plugins)
    web = None
    if opts.web and any("web" in p.components for p in placements):
        try:
            web = webport.bind(opts.host, opts.port)
        except webport.WebPortError as exc:
            say(str(exc), always=True)
        else:
            os.environ["TM_WEB_FD"] = str(web.sock.fileno())
            if web.token:
                os.environ["TM_WEB_TOKEN"] = web.token
    else:
        placements = [p for p in placements if "web" not in p.components]
    supervisor = Supervisor(
        run_dir, placements, lambda r: hub.inject(_launcher(r)), pass_fds=(web.sock.fileno(),) if web else ()
    )
    # The dashboard's socket must outlive this function: every incarnation of the web process is handed its fd.
    supervisor.web_port = web
    supervisor.start()
    if web is not None:
        for line in web.startup_lines():
            say(line)
    say(f"run {run_dir.name} in {run_dir.parent}")
    return supervisor


def join_job(opts: RunOptions, hub: Hub, run_dir: Path, say: Say):
    """Find this run's place in a job of several nodes and set the hub up for it: node rank 0 listens for the other
    nodes (tcp, CURVE, with a new key for the job), every other node forwards to it. None for a single-node run, or
    when the job cannot be joined (said in one line; the run then goes on alone, with its complete local log)."""
    plan = job_mod.discover(
        opts.command,
        os.environ,
        job=opts.job,
        node_rank=opts.node_rank,
        nnodes=opts.nnodes,
        keys_dir=opts.job_keys,
    )
    if isinstance(plan, str):
        say(f"{plan}; this run goes on alone", always=True)
        return None
    if plan is None:
        return None
    place = plan.place
    if place.node_rank == 0:
        from trainmeter_core.bus import jobkeys

        try:
            keys = jobkeys.create(plan.keys_dir, place.id)
        except jobkeys.JobKeysError as exc:
            say(f"{exc}; this run goes on alone", always=True)
            return None
        errors = []
        for endpoint in job_mod.bind_endpoints(plan):
            try:
                bound = hub.listen_job(endpoint, keys, place.nnodes, lambda line: say(line, always=True))
                break
            except Exception as exc:  # zmq.ZMQError: the address is not this node's, or the port is taken
                errors.append(f"{endpoint}: {exc}")
        else:
            say(
                f"the job hub cannot listen ({'; '.join(errors)}): pass --job HOST:PORT; this run goes on alone",
                True,
            )
            return None
        say(
            f"job {place.id} ({place.found_by}): node 0 of {place.nnodes}, the job hub listens on {bound} "
            f"(CURVE; keys in {plan.keys_dir})",
            always=True,
        )
        return plan
    from trainmeter_core.bus.forward import Forwarder

    hub.forwarder = Forwarder(
        plan.connect_endpoint,
        plan.keys_dir,
        place.node_rank,
        run_dir.name,
        say=lambda line: say(line, always=True),
        notice=hub.inject,
    )
    hub.forwarder.start()
    say(
        f"job {place.id} ({place.found_by}): node {place.node_rank} of {place.nnodes}, forwarding to "
        f"{plan.connect_endpoint} (CURVE; keys from {plan.keys_dir})",
        always=True,
    )
    return plan


def resume_target(opts: RunOptions, name: str, say: Say):
    """The run this command continues (``--resume RUN``, or the unfinished run whose checkpoint it names, said in one
    line), None for a new run, or exit status 2 after one line."""
    try:
        if opts.resume:
            return resuming.explicit(opts.resume, opts.runs_dir)
        if opts.new_run:
            return None
        found = resuming.matching(name, opts.command, os.getcwd(), opts.runs_dir)
    except resuming.ResumeError as exc:
        say(str(exc), always=True)
        return 2
    if found is None:
        return None
    target, _ = found
    say(
        f"resuming run {target.run_dir.name} as attempt {target.attempt}: {target.reason} (--new-run starts a new run)"
    )
    return target


def load_plugins(plugins_mod, say: Say):
    plugins = plugins_mod.load()
    for info in plugins.errors():
        say(f"plugin {info.name} ({info.distribution or 'unknown distribution'}) not loaded: {info.error}")
    return plugins


def watch_silence(child: Child, hub: Hub, say: Say, stop: threading.Event) -> None:
    """Say once, for each Python process of the run whose agent never said hello, why and what fixes it."""

    def report(line: str) -> None:
        say(line)
        hub.inject(rec.Notice(level="warning", topic="agent", message=line, source="launcher"))

    from trainmeter_core.run.silence import SilenceWatch

    SilenceWatch(
        child.pid,
        said_hello=lambda pid: pid in hub.hello_pids,
        anyone_said_hello=lambda: bool(hub.hello_pids),
        report=report,
        boot_dir=str(agent_boot_dir()),
        tm_python=sys.executable,
    ).start(stop)


def _launcher(record: rec.Record) -> rec.Record:
    record.source = record.source or "launcher"
    return record


def _abandon(hub, recorder, lock, sockets, run_dir, status, reason, start_t) -> int:
    hub.finish(
        rec.RunEnd(status=status, reason=reason, elapsed_s=time.monotonic() - start_t, source="launcher")
    )
    recorder.close()
    write_summary(run_dir, hub, recorder, status, reason, None, None, time.monotonic() - start_t, None)
    lock.release()
    sockets.remove()
    return status
