"""Resuming a run: which run a command continues (``--resume RUN``, or the unfinished run of the same name whose
checkpoint the command names), and reopening it for the next attempt: its lock, a fresh socket folder, its log's end.

It never starts a second launcher on a live run (the lock says so, in one line), never starts the same command again
beside its live run without ``--new-run`` (the second would train from the first one's checkpoints, unseen), and
never rewrites what earlier attempts wrote: the log goes on in a new segment, and the summary and passport of the attempt before are removed
because they no longer describe a finished run (the launcher writes them again at the end).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from trainmeter_core.errors import UsageError
from trainmeter_core.model.redaction import REDACTED, redact_argv
from trainmeter_core.runlog import rundir

if TYPE_CHECKING:
    from trainmeter_core.run.run_options import RunOptions
    from trainmeter_core.run.stderr_lines import Say
    from trainmeter_core.runlog.reopen import LogEnd

#: What the previous attempt wrote and a resumed run writes again at its end.
_REWRITTEN = ("summary.json", "passport.json", "passport.md")


class ResumeTarget(msgspec.Struct, frozen=True):
    """The run a command continues, the attempt it will be, and why (said in one line, kept in ``run.start``)."""

    run_dir: Path
    attempt: int
    reason: str
    name: str


class ResumeError(UsageError):
    """A run that cannot be resumed; the message is one line naming the run and what to do (exit 2)."""


def attempts_of(meta: dict) -> int:
    return len(meta.get("attempts") or ()) or 1


def explicit(ref: str, runs_dir: str | None) -> ResumeTarget:
    """``--resume RUN``: the run by name, prefix or path; refused while it runs."""
    try:
        run_dir = rundir.resolve_run(ref, rundir.runs_dir(runs_dir))
    except rundir.RunDirError as exc:
        raise ResumeError(f"--resume {ref}: {exc}") from None
    meta = rundir.read_json(run_dir / "meta.json")
    if meta is None:
        raise ResumeError(f"--resume {ref}: {run_dir} has no meta.json, so it is no run tm can resume")
    if meta.get("attached"):
        raise ResumeError(
            f"--resume {ref}: {run_dir.name} watched a program from outside (tm attach): nothing to resume"
        )
    _refuse_live(run_dir)
    return ResumeTarget(run_dir, attempts_of(meta) + 1, "--resume", str(meta.get("name") or run_dir.name))


def _refuse_live(run_dir: Path) -> None:
    if rundir.is_live(run_dir):
        raise ResumeError(
            f"run {run_dir.name} is still running (its launcher holds {rundir.LOCK_NAME}): "
            "resume it once it has ended, or watch it with tm view"
        )


def target_for(options: RunOptions, name: str, say: Say) -> ResumeTarget | None:
    """The run this command continues (``--resume RUN``, or the unfinished run whose checkpoint it names, said in one
    line), or None for a new run; a ``ResumeError`` (exit 2) names a run that cannot be resumed."""
    if options.resume:
        return explicit(options.resume, options.runs_dir)
    if options.new_run:
        return None
    refuse_second_start(name, options.command, os.getcwd(), options.runs_dir)
    found = matching(name, options.command, os.getcwd(), options.runs_dir)
    if found is None:
        return None
    target, _ = found
    say(
        f"resuming run {target.run_dir.name} as attempt {target.attempt}: {target.reason} (--new-run starts a new run)"
    )
    return target


def refuse_second_start(name: str, command: list[str], cwd: str, runs_dir: str | None) -> None:
    """A ``ResumeError`` (exit 2) when a run of this name still runs on this host the same command in the same folder,
    or writes its checkpoints where the command names: started again, the command would train beside it from its
    checkpoints, as a second run nobody asked for. ``--new-run`` asks for one. Different commands of one name (a
    sweep's) run side by side, and so do the nodes of a job (each on its own host)."""
    found = live_twin(name, command, cwd, runs_dir)
    if found is None:
        return
    run_dir, why = found
    # Imported here: the summary's module (and what it imports) is the end of a run's, not its start's.
    from trainmeter_core.run.summary import view_command

    raise ResumeError(
        f"run {run_dir.name} is still running {why} (its launcher holds {rundir.LOCK_NAME}): "
        f"watch it with {view_command(run_dir)}, or pass --new-run to start a second run"
    )


def live_twin(name: str, command: list[str], cwd: str, runs_dir: str | None) -> tuple[Path, str] | None:
    """The newest live run of this name on this host that runs ``command`` in ``cwd``, or writes its checkpoints
    where ``command`` names, with the words that say which; None when there is none. Only live runs are read: the
    lock is looked at first, ``meta.json`` only of a live run."""
    base = rundir.runs_dir(runs_dir)
    slug = rundir.slug(name)
    host = socket.gethostname()
    ours = redact_argv(command)
    # Only an argument that names something existing can name a checkpoint: without one, no log is read.
    names_a_path = any(os.path.exists(os.path.join(cwd, arg.split("=", 1)[-1])) for arg in command[1:] if arg)
    for run_dir in rundir.iter_runs(
        base, lambda folder: folder.endswith(f"-{slug}") or f"-{slug}-" in folder
    ):
        if not rundir.is_live(run_dir):
            continue
        meta = rundir.read_json(run_dir / "meta.json") or {}
        if meta.get("name") != name or meta.get("attached") or meta.get("host") != host:
            continue  # not described yet (it started this instant), watched from outside, or another host's
        if meta.get("cwd") != cwd or _same_slurm_step(meta.get("env") or {}):
            continue  # another folder's run, or a task of this Slurm step (srun starts one tm per task)
        if same_command(meta.get("command"), ours):
            return run_dir, "the same command"
        if names_a_path:
            from trainmeter_core.runlog.reopen import checkpoint_paths

            arg = names_checkpoint(command, cwd, checkpoint_paths(run_dir))
            if arg is not None:
                return run_dir, f"and writes its checkpoints to {arg}, which this command names"
    return None


def _same_slurm_step(recorded_env: dict) -> bool:
    """Whether a run's recorded environment is of this process's Slurm job step (both under Slurm)."""
    step = (os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"))
    return (
        step[0] is not None and (recorded_env.get("SLURM_JOB_ID"), recorded_env.get("SLURM_STEP_ID")) == step
    )


def same_command(recorded: object, redacted: list[str]) -> bool:
    """Whether a run's recorded command (redacted by the launcher, with its plugins' secret names too) is ``redacted``
    (this command, redacted by the built-in names): an element the plugins hid counts as the same."""
    if not isinstance(recorded, list) or len(recorded) != len(redacted):
        return False
    return all(
        a == b or (isinstance(a, str) and REDACTED in a) for a, b in zip(recorded, redacted, strict=True)
    )


def matching(
    name: str, command: list[str], cwd: str, runs_dir: str | None
) -> tuple[ResumeTarget, str] | None:
    """The unfinished (non-zero exit) or lost run of this name whose latest checkpoint the command names, with the
    argument that names it; None for a new run. Only the newest run of the name is considered: a run that finished
    well, or one still running, starts a new run."""
    base = rundir.runs_dir(runs_dir)
    slug = rundir.slug(name)
    candidates = rundir.iter_runs(base, lambda folder: folder.endswith(f"-{slug}") or f"-{slug}-" in folder)
    for run_dir in candidates:
        meta = rundir.read_json(run_dir / "meta.json") or {}
        if meta.get("name") != name or meta.get("attached"):
            continue
        info = rundir.run_info(run_dir)
        if info.state == "running" or info.exit_status == 0:
            return None
        # Imported here: reading a log's checkpoints loads the engine, which a new run's start need not wait for.
        from trainmeter_core.runlog.reopen import checkpoint_paths

        arg = names_checkpoint(command, cwd, checkpoint_paths(run_dir))
        if arg is None:
            return None
        reason = f"the command names {arg}, where it wrote its checkpoints"
        return ResumeTarget(run_dir, attempts_of(meta) + 1, reason, name), arg
    return None


def names_checkpoint(command: list[str], cwd: str, paths: list[str]) -> str | None:
    """The first argument of ``command`` that is one of ``paths`` or a folder holding one (and still exists); a
    folder that holds the working directory (``.``, ``..``) is too broad to say anything."""
    if not paths:
        return None
    cwd = os.path.abspath(cwd)
    for arg in command[1:]:
        for value in (arg, arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else None):
            if not value or (value.startswith("-") and value is arg):
                continue
            path = os.path.abspath(os.path.join(cwd, value))
            if path == cwd or cwd.startswith(path.rstrip(os.sep) + os.sep) or not os.path.exists(path):
                continue
            if any(p == path or p.startswith(path.rstrip(os.sep) + os.sep) for p in paths):
                return arg
    return None


class Reopened(msgspec.Struct):
    run_dir: Path
    lock: rundir.RunLock
    sockets: rundir.SocketDir
    endpoints: dict
    end: LogEnd


def reopen(target: ResumeTarget) -> Reopened:
    """The run locked for its next attempt, a new socket folder and ``endpoints.json``, where its log ends; a
    ``ResumeError`` when it started meanwhile, or its folder cannot be written."""
    from trainmeter_core.runlog.reopen import log_end

    run_dir = target.run_dir
    lock = rundir.RunLock(run_dir)
    try:
        try:
            lock.acquire()
        except BlockingIOError:
            _refuse_live(run_dir)
            raise ResumeError(f"run {run_dir.name} is locked by another tm") from None
        end = log_end(run_dir)
        for name in _REWRITTEN:
            (run_dir / name).unlink(missing_ok=True)
        base = rundir.socket_base()
        rundir.clean_stale_socket_dirs(base)
        sockets = rundir.SocketDir.create(base)
    except ResumeError:
        lock.release()
        raise
    except (rundir.RunDirError, OSError) as exc:
        lock.release()
        raise ResumeError(str(exc)) from None
    endpoints = {"in": sockets.endpoint("in"), "out": sockets.endpoint("out"), "launcher_pid": os.getpid()}
    (run_dir / "endpoints.json").write_text(json.dumps(endpoints, indent=1) + "\n")
    return Reopened(run_dir, lock, sockets, endpoints, end)
