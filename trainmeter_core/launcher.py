"""The launcher: runs the training command untouched under the hub, the recorder and the component supervisor.

Order matters: the run directory and the hub come first, then the child (it inherits tm's file descriptors, and gets
the terminal's foreground when tm has it), then tm lowers its own priority and starts its components, which catch up
from the log. tm exits with the child's status. Only tm's own writes are guarded against a closed pipe; nothing here
ever signals the child except to forward a signal tm itself received.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainmeter_core import __version__, rundir, webport
from trainmeter_core import records as rec
from trainmeter_core.hub import Hub
from trainmeter_core.recorder import Recorder
from trainmeter_core.redaction import redact_argv, redact_env
from trainmeter_core.supervisor import Placement, Supervisor

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Variables that shape a run and are worth keeping in meta.json (secrets among them are redacted).
ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "SLURM_", "HF_", "WANDB_", "TM_")
ENV_NAMES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NVIDIA_VISIBLE_DEVICES")
AGENT_BYE_WAIT_S = 3.0
LOCAL_REPLAY_MAX_B = 8 * 1024 * 1024
ENGINE_FINAL_WAIT_S = 3.0
FINAL_GRACE_S = 0.2
DIED_ALERT_WAIT_S = 3.0  # then the launcher replays from the engine's checkpoint itself
AGENT_BOOT_DIR = Path(__file__).resolve().parent.parent / "trainmeter_agent" / "boot"


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


class Say:
    """tm's own lines on stderr; a closed pipe silences them instead of raising."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.broken = False

    def __call__(self, message: str, always: bool = False) -> None:
        if self.broken or (self.quiet and not always):
            return
        try:
            sys.stderr.write(f"tm: {message}\n")
            sys.stderr.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.broken = True


def exec_untouched(opts: RunOptions) -> int:
    """Replace tm with the command itself (a tm inside a tm, or inside a torchrun rank)."""
    argv = [sys.executable, *opts.command] if opts.script_mode else opts.command
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        Say()(f"{argv[0]}: command not found", always=True)
        return 127
    except PermissionError:
        Say()(f"{argv[0]}: not executable", always=True)
        return 126


def resolve_command(opts: RunOptions, say: Say) -> list[str] | int:
    """The argv to start, or the exit status (127 not found, 126 not executable) after one clear line."""
    if opts.script_mode:
        script = opts.command[0]
        if not os.path.exists(script):
            say(
                f"{script}: no such file (to run a command rather than a script: tm -- CMD ARGS)", always=True
            )
            return 127
        if os.path.isdir(script) and not os.path.exists(os.path.join(script, "__main__.py")):
            say(f"{script}: is a directory without __main__.py", always=True)
            return 126
        return [sys.executable, *opts.command]
    program = opts.command[0]
    if os.sep in program:
        if not os.path.exists(program):
            say(f"{program}: no such file", always=True)
            return 127
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            say(f"{program}: not executable", always=True)
            return 126
        return list(opts.command)
    if shutil.which(program) is None:
        say(f"{program}: command not found", always=True)
        return 127
    return list(opts.command)


def child_environment(endpoints: dict, run_dir: Path, agent: bool, tap: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    if not tap:
        env["TM_NO_TAP"] = "1"
    env["TM_ACTIVE"] = "1"
    env["TM_RUN_DIR"] = str(run_dir)
    env["TM_LAUNCHER_PID"] = str(os.getpid())
    env["TM_AGENT_ENDPOINT"] = endpoints["in"]
    env["TM_AGENT"] = "1" if agent else "0"
    if agent:
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(AGENT_BOOT_DIR) + (os.pathsep + path if path else "")
    return env


def selected_env(secret_names: list[str]) -> dict[str, str]:
    chosen = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return redact_env(chosen, secret_names)


def lower_own_priority() -> None:
    """After the child started (so it inherits neither), tm yields CPU and is the OOM killer's first pick."""
    try:
        os.nice(5)
    except OSError:
        pass
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass


class Child:
    """The training command: its own process group, the terminal's foreground when tm has it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env
        self.pid: int | None = None
        self.status: int | None = None  # raw waitpid status
        self.exited = threading.Event()
        self.tty: int | None = None

    def start(self) -> None:
        tty = 0 if _isatty(0) else None
        foreground = tty is not None and os.tcgetpgrp(tty) == os.getpgrp()
        # Python ignores SIGPIPE and SIGXFSZ; the child gets the defaults it would have without tm.
        self.pid = os.posix_spawnp(
            self.argv[0],
            self.argv,
            self.env,
            setpgroup=0,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            setsigmask=(),
        )
        if foreground:
            self.tty = tty
            self._give_terminal(self.pid)
            try:
                os.killpg(self.pid, signal.SIGCONT)  # in case it read the terminal before it was its own
            except OSError:
                pass

    def _give_terminal(self, pgid: int) -> None:
        if self.tty is None:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(self.tty, pgid)
        except OSError:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def wait(self) -> int:
        """Wait for the child to exit, following Ctrl-Z like a shell would. Returns the raw status."""
        assert self.pid is not None
        while True:
            try:
                _, status = os.waitpid(self.pid, os.WUNTRACED)
            except ChildProcessError:
                status = 0
            if os.WIFSTOPPED(status):
                # The child was stopped (Ctrl-Z): take the terminal back, stop tm too, hand it over again on resume.
                self._give_terminal(os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)
                self._give_terminal(self.pid)
                try:
                    os.killpg(self.pid, signal.SIGCONT)
                except OSError:
                    pass
                continue
            self.status = status
            self.exited.set()
            self._give_terminal(os.getpgrp())
            return status

    def alive(self) -> bool:
        return self.pid is not None and not self.exited.is_set()

    def signal(self, signum: int) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def exit_status(status: int) -> tuple[int, str, int | None, int | None]:
    """tm's exit status, the reason, the exit code and the signal, from a raw wait status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, "signaled", None, sig
    code = os.WEXITSTATUS(status)
    return code, "exited", code, None


def open_run(name: str, runs_dir: str | None, start_wall: float, say: Say):
    """The run directory (locked), its socket folder and ``endpoints.json``; or exit status 2 after one line."""
    try:
        run_dir = rundir.create_run_dir(rundir.runs_dir(runs_dir), name, start_wall)
        lock = rundir.RunLock(run_dir)
        lock.acquire()
        base = rundir.socket_base()
        rundir.clean_stale_socket_dirs(base)
        sockets = rundir.SocketDir.create(base)
    except (rundir.RunDirError, OSError) as exc:
        say(str(exc), always=True)
        return 2
    endpoints = {"in": sockets.endpoint("in"), "out": sockets.endpoint("out"), "launcher_pid": os.getpid()}
    (run_dir / "endpoints.json").write_text(json.dumps(endpoints, indent=1) + "\n")
    return run_dir, lock, sockets, endpoints


def plan_placements(plugins) -> list[Placement]:
    """Built-in shared components run as threads of one process; the rest each get their own process.

    ``TM_OWN_PROCESS=name,name`` moves named built-ins into processes of their own (a placement, not a code change).
    """
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
        return exec_untouched(opts)  # tm inside tm: the outer one already watches
    if "LOCAL_RANK" in os.environ:
        say(
            "this is a torchrun rank (LOCAL_RANK is set): put tm outside, as `tm -- torchrun ...`",
            always=True,
        )
        return exec_untouched(opts)
    argv = resolve_command(opts, say)
    if isinstance(argv, int):
        return argv

    name = opts.name or Path(opts.command[0]).stem or "run"
    start_wall = time.time()
    start_t = time.monotonic()
    opened = open_run(name, opts.runs_dir, start_wall, say)
    if isinstance(opened, int):
        return opened
    run_dir, lock, sockets, endpoints = opened

    recorder = Recorder(run_dir, warn=say)
    recorder.start()
    child = Child(argv, child_environment(endpoints, run_dir, opts.agent, opts.tap))
    hub = Hub(endpoints["in"], endpoints["out"], recorder, child_alive=child.alive)
    hub.start()

    slurm = "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" in os.environ
    received: list[int] = []

    def forward(signum: int, _frame) -> None:
        received.append(signum)
        if not slurm:  # Slurm already signals every process of the step: forwarding would deliver it twice
            child.signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        child.start()
    except FileNotFoundError:
        say(f"{argv[0]}: command not found", always=True)
        return _abandon(hub, recorder, lock, sockets, run_dir, 127, "not_found", start_t)
    except PermissionError:
        say(f"{argv[0]}: not executable", always=True)
        return _abandon(hub, recorder, lock, sockets, run_dir, 126, "not_executable", start_t)

    # Plugins load after the child started: scanning entry points costs tens of ms the training need not wait for.
    from trainmeter_core import plugins as plugins_mod

    plugins = plugins_mod.load()
    for info in plugins.errors():
        say(f"plugin {info.name} ({info.distribution or 'unknown distribution'}) not loaded: {info.error}")
    secret_names = [n for _, names in plugins.per_plugin("trainmeter_secret_options") for n in names]
    command = redact_argv(opts.command, secret_names)
    meta = {
        "run_id": run_dir.name,
        "name": name,
        "run_dir": str(run_dir),
        "command": command,
        "script_mode": opts.script_mode,
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "start_wall": start_wall,
        "child_pid": child.pid,
        "launcher_pid": os.getpid(),
        "tm_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "agent": opts.agent,
        "slurm": slurm,
        "env": selected_env(secret_names),
        "plugins": [rec.to_builtins(i) if hasattr(i, "__struct_fields__") else i for i in plugins.infos],
    }
    import msgspec

    (run_dir / "meta.json").write_bytes(msgspec.json.format(msgspec.json.encode(meta)) + b"\n")
    hub.inject(
        rec.RunStart(
            run_id=run_dir.name,
            name=name,
            run_dir=str(run_dir),
            command=command,
            cwd=meta["cwd"],
            child_pid=child.pid,
            tm_version=__version__,
            python=meta["python"],
            platform=meta["platform"],
            env=meta["env"],
            agent=opts.agent,
            slurm=slurm,
            plugins=list(plugins.infos),
            source="launcher",
        )
    )
    for fact in declared_facts(opts.declared) + measured_peak_facts(opts.declared):
        hub.inject(fact)
    write_agent_plugins(run_dir)
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
    supervisor.start()
    if web is not None:
        for line in web.startup_lines():
            say(line)
    say(f"run {run_dir.name} in {run_dir.parent}")

    status = child.wait()
    tm_status, reason, code, sig = exit_status(status)
    # Let every agent say goodbye (its bye carries its final drop count), but never for long.
    deadline = time.monotonic() + AGENT_BYE_WAIT_S
    while hub.open_producers and time.monotonic() < deadline:
        time.sleep(0.02)
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
        )
    )
    # The engine's last snapshot is computed from run.end. A small log is replayed here in less time than the engine's
    # answer takes to come back, so only a long run waits for it (falling back to a replay from its checkpoint).
    if recorder.bytes_written > LOCAL_REPLAY_MAX_B and any(
        "engine" in p.components for p in supervisor.placements
    ):
        deadline = time.monotonic() + ENGINE_FINAL_WAIT_S
        while not (hub.last_snapshot or {}).get("final") and time.monotonic() < deadline:
            time.sleep(0.02)
    snapshot = None
    if not (hub.last_snapshot or {}).get("final"):
        # Replay what the recorder has flushed (run.end included), and publish the result as the final snapshot, so
        # subscribers, the dashboard and the alert rules (a died run) get it all the same.
        deadline = time.monotonic() + 5.0
        while (recorder.flushed_seq or 0) < hub.seq_of_end and time.monotonic() < deadline:
            time.sleep(0.01)
        snapshot = final_snapshot(run_dir, hub, say)
        if snapshot is not None:
            hub.inject(snapshot)
            time.sleep(FINAL_GRACE_S)  # let the components act on it before they are asked to stop
    if tm_status != 0 and any("alerts" in p.components for p in supervisor.placements):
        # A run that ended badly has an alert to say so, computed from the final snapshot: let it arrive.
        deadline = time.monotonic() + DIED_ALERT_WAIT_S
        while not hub.late_alerts and time.monotonic() < deadline:
            time.sleep(0.02)
    supervisor.stop()
    hub.stop()
    recorder.close()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if snapshot is None:
        snapshot = final_snapshot(run_dir, hub, say)
    summary = write_summary(
        run_dir, hub, recorder, tm_status, reason, code, sig, elapsed_s, start_wall, snapshot
    )
    write_passport(run_dir, snapshot, say)
    say(summary_line(run_dir, summary, snapshot), always=True)
    lock.release()
    sockets.remove()
    return tm_status


def declared_facts(declared: dict) -> list[rec.Fact]:
    """One ``fact`` per declared input; ``--peak-tflops`` with ``--peak-source`` becomes one ``peak`` fact."""
    facts = []
    for name, item in sorted(declared.items()):
        if name in ("peak_tflops", "peak_source"):
            continue
        facts.append(
            rec.Fact(
                name=name,
                value=item.value,
                provenance="declared",
                origin=item.origin,
                unit=item.unit,
                source="launcher",
            )
        )
    if "peak_tflops" in declared:
        peak, source = declared["peak_tflops"], declared["peak_source"]
        facts.append(
            rec.Fact(
                name="peak",
                value={
                    "flops": float(peak.value) * 1e12,
                    "label": "declared",
                    "source": source.value,
                    "device_type": None,
                },
                provenance="declared",
                origin=peak.origin,
                unit="FLOP/s",
                note=f"declared: {source.value}",
                source="launcher",
            )
        )
    return facts


def measured_peak_facts(declared: dict) -> list[rec.Fact]:
    """Peaks measured on this machine by ``tm peak``, recorded so a replay elsewhere needs no per-machine file."""
    if "peak_tflops" in declared:
        return []  # a declared peak wins; a measured one would only add a conflict to explain
    from trainmeter_core import peakstore

    facts = []
    for entry in peakstore.load_for_host(socket.gethostname()):
        facts.append(
            rec.Fact(
                name="peak",
                value={
                    "flops": entry["flops"],
                    "label": "measured",
                    "source": entry["source"],
                    "device_type": entry["device_type"],
                },
                provenance="detected",
                origin="tm peak",
                unit="FLOP/s",
                device=entry.get("device"),
                note=entry["source"],
                source="launcher",
            )
        )
    return facts


def write_agent_plugins(run_dir: Path) -> None:
    """The ``trainmeter.agent`` entry points, resolved once here, so ranks never scan package metadata."""
    from trainmeter_core import plugins as plugins_mod

    entries = []
    for ep in plugins_mod._entry_points(plugins_mod.AGENT_GROUP):
        dist = getattr(ep, "dist", None)
        entries.append(
            {
                "name": ep.name,
                "value": ep.value,
                "distribution": dist.metadata["Name"] if dist is not None else None,
                "version": dist.version if dist is not None else None,
            }
        )
    tmp = run_dir / "agent-plugins.json.tmp"
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    os.replace(tmp, run_dir / "agent-plugins.json")


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


def final_snapshot(run_dir: Path, hub: Hub, say: Say) -> rec.Snapshot | None:
    """The engine's final snapshot as it came over the bus; if the engine could not send it, a replay of the log."""
    data = hub.last_snapshot
    if data is not None and data.get("final"):
        try:
            snapshot = rec.from_mapping(dict(data))
            if isinstance(snapshot, rec.Snapshot):
                return snapshot
        except rec.MalformedRecord:
            pass
    try:
        from trainmeter_core import replay

        return replay.final_snapshot(run_dir)
    except Exception as exc:  # the summary must still be written
        say(f"could not compute the run's final numbers: {type(exc).__name__}: {exc}")
        return None


def write_passport(run_dir: Path, snapshot: rec.Snapshot | None, say: Say) -> None:
    if snapshot is None:
        return
    from trainmeter_core import passport

    try:
        meta = rundir.read_json(run_dir / "meta.json") or {}
        data = passport.passport_data(snapshot, meta)
        (run_dir / "passport.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        (run_dir / "passport.md").write_text(passport.passport_markdown(data))
    except Exception as exc:
        say(f"could not write the passport: {type(exc).__name__}: {exc}")


def write_summary(
    run_dir,
    hub,
    recorder,
    status,
    reason,
    code,
    sig,
    elapsed_s,
    start_wall,
    snapshot: rec.Snapshot | None = None,
) -> dict:
    """``summary.json``: the last snapshot (once there is an engine) merged with the launcher's own counters."""
    summary = {
        "state": "finished",
        "exit_status": status,
        "reason": reason,
        "exit_code": code,
        "signal": sig,
        "start_wall": start_wall,
        "end_wall": time.time(),
        "elapsed_s": elapsed_s,
        "steps": hub.steps,
        "skipped_steps": hub.skipped_steps,
        "records": dict(sorted(hub.kinds.items())),
        "bus": {
            "received": hub.received,
            "malformed": hub.malformed,
            "unknown": hub.unknown,
            "dropped": dict(hub.dropped),
            "dropped_total": hub.dropped_total(),
            "log_queue_dropped": recorder.queue_dropped,
            "log_reserve_skipped": recorder.reserve_skipped,
            "log_bytes": recorder.bytes_written,
            "log_segments": recorder.segments,
        },
        "hub_error": hub.error,
        "snapshot": None if snapshot is None else rec.to_builtins(snapshot),
    }
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    os.replace(tmp, run_dir / "summary.json")
    return summary


def _number(metric: rec.MetricValue | None, unit: str = "", scale: float = 1.0) -> str | None:
    if metric is None:
        return None
    labels = ", ".join(x for x in (metric.convention, metric.label) if x)
    suffix = f" ({labels})" if labels else ""
    if metric.value is not None:
        return f"{metric.value * scale:.3g}{unit}{suffix}"
    if metric.low is not None and metric.high is not None:
        return (
            f"{metric.low * scale:.3g}-{metric.high * scale:.3g}{unit}{suffix or ' (range over conventions)'}"
        )
    # The first missing input is enough for one line; `tm view` and the dashboard name them all.
    return f"n/a ({metric.absent.split('; ')[0]})" if metric.absent else None


def summary_line(run_dir: Path, summary: dict, snapshot: rec.Snapshot | None = None) -> str:
    status = summary["exit_status"]
    parts = [f"finished in {summary['elapsed_s']:.1f} s", f"exit {status}", f"{summary['steps']} steps"]
    if summary["skipped_steps"]:
        parts.append(f"{summary['skipped_steps']} skipped")
    if snapshot is not None and snapshot.steps:
        m = snapshot.metrics
        tokens = _number(m.get("tokens"))
        flops = _number(m.get("flops_spent"), " FLOP")
        mfu = _number(m.get("mfu_avg"), "%", 100.0)
        if tokens:
            parts.append(f"tokens {tokens}")
        if flops:
            parts.append(f"FLOPs {flops}")
        if mfu:
            parts.append(f"MFU {mfu}")
        losses = [
            f"{k} {p.value:.4g}"
            for k, p in sorted(snapshot.series.items())
            if k in ("train_loss", "val_loss")
        ]
        parts.extend(losses)
    drops = summary["bus"]["dropped_total"]
    parts.append(f"{drops} records dropped" if drops else "nothing dropped")
    parts.append(f"see it again: tm view {run_dir.name}")
    return " · ".join(parts)
