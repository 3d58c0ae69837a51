"""The keys of a job of several nodes: one secret, made by node rank 0, from which the job hub's CURVE key pair and
each node's are derived.

The secret travels only as a file (mode 0600, in a folder of mode 0700) on a filesystem every node shares (a home
directory, Slurm's shared filesystem, or a path the user names); it never crosses the network. Because each node's key
pair is derived from the secret and its node rank, the job hub knows every allowed client key without any exchange,
and its ZAP handler refuses any other. This module must never log or print a secret key.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.utils.z85

KEYS_FILE = "job.keys"
_SECRET_B = 32


class JobKeysError(RuntimeError):
    """The job's keys cannot be read or written; the message is one line saying which file and what to do."""


def _derive(secret: bytes, label: str) -> bytes:
    # A keyed BLAKE2b of the label: a distinct 32-byte Curve25519 secret per role, none revealing the job's secret.
    return zmq.utils.z85.encode(hashlib.blake2b(label.encode(), key=secret, digest_size=32).digest())


@dataclass(frozen=True)
class JobKeys:
    """The job's secret and what follows from it: the hub's key pair and any node's."""

    job: str
    secret: bytes
    path: Path
    mtime_ns: int

    def hub_pair(self) -> tuple[bytes, bytes]:
        """(public, secret) of the job hub, Z85."""
        secret = _derive(self.secret, "hub")
        return zmq.curve_public(secret), secret

    def node_pair(self, node_rank: int) -> tuple[bytes, bytes]:
        """(public, secret) of node ``node_rank``, Z85."""
        secret = _derive(self.secret, f"node {node_rank}")
        return zmq.curve_public(secret), secret

    def allowed(self, nnodes: int) -> dict[bytes, int]:
        """The raw 32-byte public key of every node rank 1..nnodes-1 (what ZAP receives) -> its node rank."""
        return {zmq.utils.z85.decode(self.node_pair(k)[0]): k for k in range(1, nnodes)}


def keys_path(folder: Path) -> Path:
    return folder / KEYS_FILE


def create(folder: Path, job: str) -> JobKeys:
    """A new secret for ``job`` in ``folder`` (made 0700 if new), replacing any previous job's: written to a temporary
    file of mode 0600 and renamed, so a node never reads half a file."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = keys_path(folder)
        tmp = folder / f".{KEYS_FILE}.{os.getpid()}.tmp"
        secret = secrets.token_bytes(_SECRET_B)
        body = json.dumps({"job": job, "secret": zmq.utils.z85.encode(secret).decode()}) + "\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return JobKeys(job=job, secret=secret, path=path, mtime_ns=path.stat().st_mtime_ns)
    except OSError as exc:
        raise JobKeysError(
            f"cannot write the job's keys in {folder}: {exc.strerror or exc}; name a writable folder every node "
            "shares with --job-keys DIR (or TM_JOB_KEYS)"
        ) from None


def load(folder: Path) -> JobKeys | None:
    """The job's keys from ``folder``, or None while node rank 0 has not written them yet.

    Raises JobKeysError for a file that others may read (a secret readable by other users is no secret) or that is
    not a keys file.
    """
    path = keys_path(folder)
    try:
        info = path.stat()
        if info.st_mode & 0o077:
            raise JobKeysError(
                f"{path} may be read by other users (mode {info.st_mode & 0o777:o}): tm uses a job's keys only "
                f"from a file of mode 0600; chmod 600 {path}"
            )
        data = json.loads(path.read_text())
        secret = zmq.utils.z85.decode(data["secret"].encode())
        if len(secret) != _SECRET_B:
            raise ValueError("the secret is not 32 bytes")
        return JobKeys(job=str(data["job"]), secret=secret, path=path, mtime_ns=info.st_mtime_ns)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise JobKeysError(
            f"{path} is not a tm job keys file ({exc}); remove it and start node 0 again"
        ) from None


def default_folder(job: str, environ: dict[str, str] | None = None) -> Path:
    """Where the job's keys go when the user names no folder: ``TM_JOB_KEYS``, else a folder per job under the home
    directory, which the nodes of a cluster usually share (Slurm's shared filesystem too)."""
    env = os.environ if environ is None else environ
    named = env.get("TM_JOB_KEYS")
    if named:
        return Path(named)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)[:100] or "job"
    return Path(env.get("HOME") or Path.home()) / ".trainmeter" / "jobs" / safe
