"""Run directories, the lock that says a run is live, and the short socket folders the bus listens in.

A run is live while its launcher holds an exclusive ``flock`` on ``run.lock``: the kernel drops it when the launcher
dies, even by SIGKILL, so a reader never trusts a pid. Nothing here writes the run log (the recorder alone does).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

RUNS_SUBDIR = Path(".trainmeter") / "runs"
LOCK_NAME = "run.lock"
#: ipc:// paths are limited by sockaddr_un to 107 bytes.
IPC_PATH_MAX = 107


class RunDirError(RuntimeError):
    """A run directory that cannot be made or found; the message is one line naming the flag that fixes it."""


def runs_dir(flag: str | None = None, environ: os.PathLike | None = None) -> Path:
    """Where runs go: ``--runs-dir``, else ``TM_RUNS_DIR``, else ``.trainmeter/runs`` under the current directory."""
    env = os.environ if environ is None else environ
    if flag:
        return Path(flag).expanduser().absolute()
    if env.get("TM_RUNS_DIR"):
        return Path(env["TM_RUNS_DIR"]).expanduser().absolute()
    return (Path.cwd() / RUNS_SUBDIR).absolute()


def slug(text: str) -> str:
    """A name as it goes into a run directory's name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:48] or "run"


def create_run_dir(base: Path, name: str, wall: float | None = None, host: str | None = None) -> Path:
    """Make ``<base>/<UTC time>-<host>-<name>/`` with mode 0700 (and a ``.gitignore`` of ``*`` beside the runs)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if wall is None else wall))
    host = slug((host or socket.gethostname()).split(".")[0])
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        if base.name == "runs" and base.parent.name == ".trainmeter":
            ignore = base.parent / ".gitignore"
            if not ignore.exists():
                ignore.write_text("*\n")
        for attempt in range(1, 1000):
            suffix = "" if attempt == 1 else f"-{attempt}"
            path = base / f"{stamp}-{host}-{slug(name)}{suffix}"
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
            return path
    except OSError as exc:
        raise RunDirError(
            f"cannot create a run directory under {base} ({exc.strerror or exc}): pass --runs-dir DIR or set TM_RUNS_DIR"
        ) from None
    raise RunDirError(f"too many runs named {name!r} in one second under {base}")


class RunLock:
    """The launcher's exclusive lock on a run; held for the whole run, released by the kernel if tm dies."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held by another launcher (BlockingIOError): the caller says so
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def is_live(run_dir: Path) -> bool:
    """True while a launcher holds the run's lock."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


class RunInfo(msgspec.Struct):
    path: Path
    name: str
    state: str  # "running", "finished (exit N)", "lost"
    start_wall: float | None
    end_wall: float | None
    steps: int | None
    exit_status: int | None
    attempts: int = 1  # a resumed run's starts (meta.json lists them)
    job_identity: dict | None = None  # the scheduler's ids (Slurm, Kubernetes) meta.json holds


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_info(run_dir: Path) -> RunInfo:
    """What ``tm runs`` shows of one run. Live is judged by the lock (first: a resumed run may still hold the summary
    of its previous attempt for a moment), finished by ``summary.json``."""
    meta = read_json(run_dir / "meta.json") or {}
    start = meta.get("start_wall")
    attempts = len(meta.get("attempts") or ()) or 1
    ids = meta.get("job_identity") if isinstance(meta.get("job_identity"), dict) else None
    if is_live(run_dir):
        return RunInfo(run_dir, run_dir.name, "running", start, None, None, None, attempts, ids)
    summary = read_json(run_dir / "summary.json")
    if summary is not None and summary.get("state") == "finished":
        status = summary.get("exit_status")
        return RunInfo(
            run_dir,
            run_dir.name,
            f"finished (exit {status})",
            start,
            summary.get("end_wall"),
            summary.get("steps"),
            status,
            attempts,
            ids,
        )
    return RunInfo(run_dir, run_dir.name, "lost", start, None, None, None, attempts, ids)


def list_runs(base: Path) -> list[Path]:
    """Run directories under ``base``, newest first (names start with their UTC start time)."""
    return list(iter_runs(base))


def iter_runs(base: Path, named: Callable[[str], bool] | None = None) -> Iterator[Path]:
    """``list_runs`` one at a time, newest first, of the names ``named`` accepts: each folder is looked at only when
    the caller gets to it. A sweep's runs directory holds thousands of runs, and every start looks for the newest of
    its name (3000 runs: 30 ms to look at them all)."""
    if not base.is_dir():
        return
    for name in sorted(os.listdir(base), reverse=True):
        if named is not None and not named(name):
            continue
        path = base / name
        if path.is_dir() and ((path / "meta.json").exists() or (path / LOCK_NAME).exists()):
            yield path


def resolve_run(ref: str | None, base: Path | None = None) -> Path:
    """A run by directory path, by name or unique prefix under the runs directory, or the latest when ``ref`` is None."""
    if ref and (Path(ref) / "meta.json").exists() or ref and (Path(ref) / "endpoints.json").exists():
        return Path(ref).absolute()
    base = runs_dir() if base is None else base
    runs = list_runs(base)
    if ref is None:
        if not runs:
            raise RunDirError(f"no runs under {base}: run one with `tm train.py`, or pass --runs-dir DIR")
        return runs[0]
    matches = [p for p in runs if p.name == ref] or [p for p in runs if p.name.startswith(ref)]
    if not matches:
        # A run's name is the part after the time and the host: accept that too.
        matches = [p for p in runs if p.name.endswith(f"-{ref}") or f"-{ref}" in p.name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunDirError(f"no run matches {ref!r} under {base}: `tm runs` lists them")
    names = ", ".join(p.name for p in matches[:5])
    raise RunDirError(f"{ref!r} matches {len(matches)} runs ({names}): give more of the name")


# --------------------------------------------------------------------------------------------------------------------
# Socket folders


def socket_base(environ: os.PathLike | None = None) -> Path:
    """The per-user folder that holds each run's socket folder: short, mode 0700, ours alone."""
    env = os.environ if environ is None else environ
    uid = os.getuid()
    candidates = [
        env.get("TM_SOCKET_DIR"),
        os.path.join(tempfile.gettempdir(), f"tm-{uid}"),
        f"/tmp/tm-{uid}",
    ]
    for cand in candidates:
        if not cand or len(cand) + 20 > IPC_PATH_MAX:
            continue
        path = Path(cand)
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            st = path.lstat()
        except OSError:
            continue
        if st.st_uid != uid or not path.is_dir() or path.is_symlink():
            continue  # someone else's folder: never put our sockets there
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        return path
    raise RunDirError("no private folder for the bus sockets: set TM_SOCKET_DIR to a short directory you own")


class SocketDir:
    """One run's socket folder, locked by its launcher so the next ``tm`` can tell a stale one."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd

    @classmethod
    def create(cls, base: Path) -> SocketDir:
        """A new folder under ``base``, its ``lock`` held. The lock is taken under another name and then renamed to
        ``lock``: a ``clean_stale_socket_dirs`` of another tm starting at the same moment never finds a ``lock`` that
        is not held yet (it would take it for a dead launcher's and remove the folder under this one)."""
        for _ in range(100):
            path = base / os.urandom(4).hex()  # what secrets.token_hex does, without its hashlib import
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue
            fd = os.open(path / "lock.new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(path / "lock.new", path / "lock")
            return cls(path, fd)
        raise RunDirError(f"cannot create a socket folder under {base}")

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            os.close(self._lock_fd)
        except OSError:
            pass


def clean_stale_socket_dirs(base: Path) -> int:
    """Remove socket folders whose launcher is gone (their lock is free). Returns how many were removed."""
    removed = 0
    for path in base.iterdir() if base.is_dir() else ():
        lock = path / "lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            # No lock file: a folder being made right now, or debris older than an hour.
            try:
                if time.time() - path.lstat().st_mtime > 3600:
                    shutil.rmtree(path, ignore_errors=True)
                    removed += 1
            except OSError:
                pass
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed
