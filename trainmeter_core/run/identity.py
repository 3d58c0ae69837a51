"""A run's identity: its directory (locked), its sockets, and the one description of it that becomes both
``meta.json`` and the ``run.start`` record, whether tm started the program or attached to it; then the facts the
launcher knows before the agent says anything (declared inputs, measured peaks) and the agent's plugin list.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import threading
from pathlib import Path

import msgspec

from trainmeter_core import __version__
from trainmeter_core.errors import UsageError
from trainmeter_core.model import money, records
from trainmeter_core.model.redaction import redact_env
from trainmeter_core.runlog import rundir

#: Variables that shape a run and are worth keeping in meta.json (secrets among them are redacted).
ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "SLURM_", "HF_", "WANDB_", "TM_")
ENV_NAMES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NVIDIA_VISIBLE_DEVICES")


_platform: list[str] = []  # platform.platform(), once looked up
_platform_lookup: threading.Thread | None = None


def look_up_platform() -> None:
    """Start ``platform.platform()`` in a thread: it runs ``uname -p`` in a subprocess (5-9 ms, mostly waiting, so
    without the GIL), which the launcher's start need not wait for; ``describe_run`` takes the result."""
    global _platform_lookup

    def look() -> None:
        try:
            _platform.append(platform.platform())
        except Exception:
            pass  # describe_run asks again, and says what goes wrong

    if _platform_lookup is None and not _platform:
        _platform_lookup = threading.Thread(target=look, name="tm-platform", daemon=True)
        _platform_lookup.start()


def _platform_name() -> str:
    if _platform_lookup is not None:
        _platform_lookup.join()
    if not _platform:  # never looked up (tm attach), or the lookup failed: here and now, as before
        _platform.append(platform.platform())
    return _platform[0]


def describe_run(
    run_dir: Path,
    *,
    name: str,
    command: list[str],
    cwd: str | None,
    start_wall: float,
    start_t: float,
    child_pid: int | None,
    env: dict[str, str],
    plugins: list[records.PluginInfo],
    source: str,
    script_mode: bool = False,
    agent: bool = True,
    slurm: bool = False,
    attached: bool = False,
    job: records.JobPlace | None = None,
    job_identity: records.JobIdentity | None = None,
    attempt: int = 1,
    resume_reason: str | None = None,
) -> records.RunStart:
    """Write ``meta.json`` and return the ``run.start`` record: the same facts, from one place.

    ``command`` and ``env`` are already redacted. ``cwd`` is None when it cannot be read (an attached program's).
    The record is dated when the run started (``start_t``, ``start_wall``), not when it is sent: the child may have
    sent its first step before the launcher got round to describing the run, and the time split counts from here.
    A resumed run (``attempt`` > 1) keeps its name and first start, and ``meta.json`` lists every attempt.
    """
    meta = {
        "run_id": run_dir.name,
        "name": name,
        "run_dir": str(run_dir),
        "command": command,
        "script_mode": script_mode,
        **({"attached": True} if attached else {}),
        "cwd": cwd,
        "host": socket.gethostname(),
        "start_wall": start_wall,
        "child_pid": child_pid,
        "launcher_pid": os.getpid(),
        "tm_version": __version__,
        "python": sys.version.split()[0],
        "platform": _platform_name(),
        "agent": agent,
        "slurm": slurm,
        "env": env,
        "plugins": [records.to_builtins(info) for info in plugins],
        **({"job": msgspec.to_builtins(job)} if job is not None else {}),
        **({"job_identity": msgspec.to_builtins(job_identity)} if job_identity is not None else {}),
    }
    if attempt > 1:
        previous = rundir.read_json(run_dir / "meta.json") or {}
        earlier = list(previous.get("attempts") or [_attempt_entry(previous, 1)])
        meta["name"] = name = previous.get("name") or name
        meta["start_wall"] = previous.get("start_wall", start_wall)
        meta["attempts"] = [
            *earlier,
            _attempt_entry({**meta, "start_wall": start_wall}, attempt, resume_reason),
        ]
    write_meta(run_dir, meta)
    return records.RunStart(
        t=start_t,
        wall=start_wall,
        run_id=run_dir.name,
        name=name,
        run_dir=str(run_dir),
        command=command,
        cwd=cwd or "",
        child_pid=child_pid,
        tm_version=__version__,
        python=meta["python"],
        platform=meta["platform"],
        env=env,
        agent=agent,
        slurm=slurm,
        plugins=list(plugins),
        job=job,
        job_identity=job_identity,
        source=source,
        attempt=attempt,
        resume_reason=resume_reason,
        absent={} if cwd is not None else {"cwd": "the program's working folder is not readable"},
    )


def _attempt_entry(meta: dict, attempt: int, resume_reason: str | None = None) -> dict:
    """One attempt of a resumed run as ``meta.json`` lists it."""
    entry = {k: meta.get(k) for k in ("start_wall", "command", "cwd", "host", "child_pid", "launcher_pid")}
    entry["tm_version"] = meta.get("tm_version")
    if meta.get("job_identity") is not None:  # a requeued job resumes under another Slurm job or pod
        entry["job_identity"] = meta["job_identity"]
    return {"attempt": attempt, **entry, **({"resume_reason": resume_reason} if resume_reason else {})}


def write_meta(run_dir: Path, meta: dict) -> None:
    """``meta.json``, whose one writer is the run's launcher (or ``tm attach``)."""
    tmp = run_dir / "meta.json.tmp"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(meta)) + b"\n")
    os.replace(tmp, run_dir / "meta.json")


def note_child_pid(run_dir: Path, pid: int) -> None:
    """The command's pid, once it started after ``meta.json`` was written (a resumed attempt writes it first)."""
    meta = rundir.read_json(run_dir / "meta.json")
    if meta is None:
        return
    meta["child_pid"] = pid
    if meta.get("attempts"):
        meta["attempts"][-1]["child_pid"] = pid
    write_meta(run_dir, meta)


#: Where tests (and a user who knows better) point tm at other copies of the two files the job's identity reads.
CGROUP_FILE_VARIABLE = "TM_CGROUP_FILE"
NAMESPACE_FILE_VARIABLE = "TM_K8S_NAMESPACE_FILE"


def read_job_identity(
    environ: dict[str, str] | None = None,
    cgroup_file: str | None = None,
    namespace_file: str | None = None,
) -> records.JobIdentity:
    """The scheduler's ids of this run (``model/job_identity``), read without root from ``environ``, the process's
    cgroup list and the service account's namespace file. A file's path is the argument, else its variable
    (``TM_CGROUP_FILE``, ``TM_K8S_NAMESPACE_FILE``), else the real one; ``tm attach`` passes the program's own."""
    from trainmeter_core.model import job_identity

    env = os.environ if environ is None else environ
    cgroup_path = cgroup_file or env.get(CGROUP_FILE_VARIABLE) or job_identity.CGROUP_FILE
    namespace_path = namespace_file or env.get(NAMESPACE_FILE_VARIABLE) or job_identity.NAMESPACE_FILE
    in_a_pod = job_identity.in_a_pod(env)
    # Outside a pod neither file can say anything: the launcher's start reads nothing it would throw away.
    cgroup_text, cgroup_why = _read_text(cgroup_path) if in_a_pod else (None, None)
    namespace_text, namespace_why = (
        _read_text(namespace_path) if in_a_pod and not env.get("POD_NAMESPACE") else (None, None)
    )
    return job_identity.job_identity(
        env,
        hostname=socket.gethostname(),
        namespace_text=namespace_text,
        namespace_why=namespace_why,
        cgroup_text=cgroup_text,
        cgroup_why=cgroup_why,
        namespace_file=namespace_path,
        cgroup_file=cgroup_path,
    )


def _read_text(path: str) -> tuple[str | None, str | None]:
    """A small file's text, or None and why it cannot be read (``is not readable (No such file or directory)``)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(65536), None
    except OSError as exc:
        return None, f"is not readable ({exc.strerror or type(exc).__name__})"


def selected_env(secret_names: list[str]) -> dict[str, str]:
    # A price is a view's, never the run's (SPEC invariant 9): its variables stay out of the run's description.
    chosen = {
        k: v
        for k, v in os.environ.items()
        if (k.startswith(ENV_PREFIXES) or k in ENV_NAMES) and not money.is_price_variable(k)
    }
    return redact_env(chosen, secret_names)


def open_run(name: str, runs_dir: str | None, start_wall: float):
    """The run directory (locked), its socket folder and ``endpoints.json``; a ``UsageError`` naming what cannot be
    created."""
    look_up_platform()  # for describe_run, meanwhile
    try:
        run_dir = rundir.create_run_dir(rundir.runs_dir(runs_dir), name, start_wall)
        lock = rundir.RunLock(run_dir)
        lock.acquire()
        base = rundir.socket_base()
        rundir.clean_stale_socket_dirs(base)
        sockets = rundir.SocketDir.create(base)
    except (rundir.RunDirError, OSError) as exc:
        raise UsageError(str(exc)) from None
    endpoints = {"in": sockets.endpoint("in"), "out": sockets.endpoint("out"), "launcher_pid": os.getpid()}
    (run_dir / "endpoints.json").write_text(json.dumps(endpoints, indent=1) + "\n")
    return run_dir, lock, sockets, endpoints


def declared_facts(declared: dict) -> list[records.Fact]:
    """One ``fact`` per declared input; ``--peak-tflops`` with ``--peak-source`` becomes one ``peak`` fact."""
    if not declared:
        return []
    # The fact model is needed only by a run that declares something.
    from trainmeter_core.model.facts import RENAMED_FACTS

    facts = []
    for name, item in sorted(declared.items()):
        if name in ("peak_tflops", "peak_source"):
            continue
        facts.append(
            records.Fact(
                name=RENAMED_FACTS.get(name, name),  # --budget-flops is a count: the fact is budget_flop
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
            records.Fact(
                name="peak",
                value={
                    "flop_per_s": float(peak.value) * 1e12,
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


def measured_peak_facts(declared: dict) -> list[records.Fact]:
    """Peaks measured on this machine by ``tm peak``, recorded so a replay elsewhere needs no per-machine file."""
    if "peak_tflops" in declared:
        return []  # a declared peak wins; a measured one would only add a conflict to explain
    from trainmeter_core.run import peakstore

    facts = []
    for entry in peakstore.load_for_host(socket.gethostname()):
        # Every peak of this host goes in, one per (device, dtype, threads): the engine scores the run against the
        # one measured with the run's own dtype and threads, never another.
        facts.append(
            records.Fact(
                name="peak",
                value={
                    "flop_per_s": entry["flop_per_s"],
                    "label": "measured",
                    "source": entry["source"],
                    "device_type": entry.get("device_type"),
                    "dtype": entry.get("dtype"),
                    "threads": entry.get("threads"),
                    "measured_wall": entry.get("measured_wall"),
                    "spread_flop_per_s": entry.get("spread_flop_per_s"),
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


def write_agent_plugins(run_dir: Path) -> list[str]:
    """The ``trainmeter.agent`` entry points, resolved once here, so ranks never scan package metadata. Written before
    the command starts: its agent reads the list once, at its start, to know which libraries' imports load a tap.
    Returns the entry points' names, which the command's environment carries too (``TM_AGENT_PLUGIN_NAMES``)."""
    from trainmeter_core import entrypoints

    entries = []
    for ep in entrypoints._entry_points(entrypoints.AGENT_GROUP):
        dist = getattr(ep, "dist", None)
        entries.append(
            {
                "name": ep.name,
                "value": ep.value,
                "distribution": dist.name if dist is not None else None,
                "version": dist.version if dist is not None else None,
            }
        )
    tmp = run_dir / "agent-plugins.json.tmp"
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    os.replace(tmp, run_dir / "agent-plugins.json")
    return [entry["name"] for entry in entries]
