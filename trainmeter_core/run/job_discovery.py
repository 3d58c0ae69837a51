"""How a run finds the job of several nodes it belongs to, and its place in it, from what the launcher already has.

In order: tm's own ``--job HOST:PORT`` (with ``--node-rank``/``--nnodes`` where nothing else says), torchrun's flags in
the command (``--nnodes``, ``--node_rank``, ``--rdzv-endpoint`` or ``--master_addr``/``--master_port``, and the
``PET_*`` variables torchrun reads for them), the ``MASTER_ADDR``/``NODE_RANK`` environment, then Slurm's variables.
A single-node run finds no job. This module only reads: it opens no socket and writes no file.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from trainmeter_core.model.records import JobPlace

#: The job hub listens one port above the rendezvous port (torchrun's defaults: 29400 for an endpoint, 29500 for a
#: master port), so every node derives the same address without being told.
PORT_ABOVE_RENDEZVOUS = 1
C10D_DEFAULT_PORT = 29400
MASTER_DEFAULT_PORT = 29500
#: Under Slurm with no rendezvous to derive from: a port from the job id, the same on every node of the job.
SLURM_PORT_BASE = 41000
SLURM_PORT_SPAN = 10000

_LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# torchrun options that take no value (all others do): the script starts after the options.
_TORCHRUN_SWITCHES = {
    "--standalone",
    "--no-python",
    "--no_python",
    "--run-path",
    "--run_path",
    "--module",
    "-m",
    "--tee-logs",
}


class JobPlan(msgspec.Struct, frozen=True):
    """A run's place in a job: what goes into ``run.start``, and where the job hub is and the keys are."""

    place: JobPlace
    hub_host: str
    port: int
    keys_dir: Path

    @property
    def connect_endpoint(self) -> str:
        return f"tcp://{_bracket(self.hub_host)}:{self.port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def torchrun_options(command: Sequence[str]) -> dict[str, str] | None:
    """The options given to torchrun (``--node-rank`` and ``--node_rank`` both as ``node_rank``), or None when the
    command does not run torchrun."""
    start = None
    for i, token in enumerate(command):
        if os.path.basename(token) == "torchrun":
            start = i + 1
            break
        if token == "-m" and i + 1 < len(command) and command[i + 1] in _LAUNCH_MODULES:
            start = i + 2
            break
    if start is None:
        return None
    options: dict[str, str] = {}
    i = start
    while i < len(command):
        token = command[i]
        if not token.startswith("-"):
            break  # the training script: what follows is its own
        if token in _TORCHRUN_SWITCHES:
            i += 1
            continue
        name, eq, value = token.partition("=")
        if not eq:
            if i + 1 >= len(command):
                break
            value = command[i + 1]
            i += 1
        options[name.lstrip("-").replace("-", "_")] = value
        i += 1
    return options


def _nnodes(text: str | None) -> int | None:
    """``3`` or an elastic ``2:4`` (the most it may grow to)."""
    if not text:
        return None
    try:
        return int(text.rpartition(":")[2])
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def _host_port(text: str, default_port: int) -> tuple[str, int] | None:
    """``host:port``, ``host``, ``[v6]:port`` -> (host, port)."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = _int(rest.lstrip(":")) if rest else default_port
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _int(port_text)
    else:
        host, port = text, default_port
    if not host or port is None or not 0 < port < 65536:
        return None
    return host, port


def slurm_first_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list in its compressed form (``gpu[07-09,12],login1`` -> ``gpu07``)."""
    depth = 0
    first = ""
    for char in nodelist:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            break
        first += char
    # Each bracket holds ranges; the first host takes the first number of each, padding kept.
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)
    return host or None


class JobUnjoinable(Exception):
    """A job is named but something it needs is missing: one line naming it (the run then goes on alone)."""


class _Clues(msgspec.Struct):
    """What the command line and the environment said so far; each source fills only what is still unknown."""

    rank: int | None
    count: int | None
    hub: tuple[str, int] | None = None
    found_by: str | None = None
    job_id: str | None = None


def discover(
    command: Sequence[str],
    environ: Mapping[str, str],
    *,
    job: str | None = None,
    node_rank: int | None = None,
    nnodes: int | None = None,
    keys_dir: str | None = None,
) -> JobPlan | None:
    """This run's place in a job of several nodes; None for a single-node run; ``JobUnjoinable`` when a job is named
    but something it needs is missing."""
    clues = _Clues(rank=node_rank, count=nnodes)
    if job is not None:
        clues.hub = _host_port(job, 0)
        if clues.hub is None or clues.hub[1] == 0:
            raise JobUnjoinable(
                f"--job {job}: give the job hub's address as HOST:PORT (node rank 0's address and a free port)"
            )
        clues.found_by = "--job"
    _read_torchrun(clues, command, environ)
    _read_environment(clues, environ)
    _read_slurm(clues, environ)
    return _plan(clues, job, keys_dir, environ)


def _read_torchrun(clues: _Clues, command: Sequence[str], env: Mapping[str, str]) -> None:
    """torchrun's flags in the command, or the ``PET_*`` variables torchrun reads for them."""
    opts = torchrun_options(command) or {}
    if not (opts or any(k.startswith("PET_") for k in env)):
        return

    def opt(name: str) -> str | None:
        return opts.get(name) or env.get(f"PET_{name.upper()}")

    if clues.rank is None:
        clues.rank = _int(opt("node_rank"))
    if clues.count is None:
        clues.count = _nnodes(opt("nnodes"))
    endpoint = opt("rdzv_endpoint")
    if clues.hub is None and endpoint:
        hub = _host_port(endpoint, C10D_DEFAULT_PORT)
        clues.hub = None if hub is None else (hub[0], hub[1] + PORT_ABOVE_RENDEZVOUS)
        clues.found_by = "torchrun flags"
    elif clues.hub is None and opt("master_addr"):
        port = _int(opt("master_port")) or MASTER_DEFAULT_PORT
        clues.hub = (str(opt("master_addr")), port + PORT_ABOVE_RENDEZVOUS)
        clues.found_by = "torchrun flags"
    rdzv_id = opt("rdzv_id")
    if rdzv_id and rdzv_id != "none":
        clues.job_id = f"torchrun-{rdzv_id}"


def _read_environment(clues: _Clues, env: Mapping[str, str]) -> None:
    """``MASTER_ADDR``/``MASTER_PORT`` with ``NODE_RANK``, and ``NNODES``."""
    if clues.hub is None and env.get("MASTER_ADDR") and env.get("NODE_RANK") is not None:
        port = _int(env.get("MASTER_PORT")) or MASTER_DEFAULT_PORT
        clues.hub = (env["MASTER_ADDR"], port + PORT_ABOVE_RENDEZVOUS)
        clues.found_by = "environment"
    if clues.rank is None:
        clues.rank = _int(env.get("NODE_RANK"))
    if clues.count is None:
        clues.count = _nnodes(env.get("NNODES"))


def _read_slurm(clues: _Clues, env: Mapping[str, str]) -> None:
    """A Slurm allocation of several nodes: the node's id, the node count, and a port from the job id on the first
    host of the node list."""
    slurm_nodes = _int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"))
    if not (env.get("SLURM_JOB_ID") and slurm_nodes and slurm_nodes > 1):
        return
    if clues.rank is None:
        clues.rank = _int(env.get("SLURM_NODEID"))
    if clues.count is None:
        clues.count = slurm_nodes
    if clues.job_id is None:
        clues.job_id = f"slurm-{env['SLURM_JOB_ID']}"
    first = slurm_first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    if clues.hub is None and first:
        job_number = _int(env["SLURM_JOB_ID"].split("_")[0]) or 0
        clues.hub = (first, SLURM_PORT_BASE + job_number % SLURM_PORT_SPAN)
        clues.found_by = "slurm"


def _plan(clues: _Clues, job: str | None, keys_dir: str | None, env: Mapping[str, str]) -> JobPlan | None:
    """The place the clues give, None when they describe a single-node run, or what is missing to join the job."""
    hub, rank, count, found_by = clues.hub, clues.rank, clues.count, clues.found_by
    if hub is None:
        return None  # no rendezvous, no Slurm allocation of several nodes: a single-node run
    if count is None and found_by != "--job":
        if rank in (None, 0):
            return None
        raise JobUnjoinable(f"node rank {rank} but no node count: pass --nnodes N")
    if count is not None and count < 2:
        return None  # one node: the run holds everything already
    if rank is None:
        raise JobUnjoinable(
            f"job {hub[0]}:{hub[1]} ({found_by}) but this node's rank is unknown: pass --node-rank K"
        )
    if count is None:
        raise JobUnjoinable(f"--job {job}: the number of nodes is unknown: pass --nnodes N")
    if not 0 <= rank < count:
        raise JobUnjoinable(f"node rank {rank} is outside the job's {count} nodes (0..{count - 1})")
    job_id = clues.job_id or f"{hub[0]}:{hub[1]}"
    from trainmeter_core.bus.jobkeys import default_folder

    folder = Path(keys_dir) if keys_dir else default_folder(job_id, dict(env))
    place = JobPlace(
        id=job_id, node_rank=rank, nnodes=count, hub=f"{_bracket(hub[0])}:{hub[1]}", found_by=found_by
    )
    return JobPlan(place=place, hub_host=hub[0], port=hub[1], keys_dir=folder)


def bind_endpoints(plan: JobPlan) -> list[str]:
    """Where the job hub tries to listen, in order: the rendezvous host's own address on this node, then every
    address (when the name the nodes use is not one of this node's, e.g. a load balancer's or a NAT's)."""
    addresses: list[str] = []
    try:
        infos = socket.getaddrinfo(plan.hub_host, plan.port, type=socket.SOCK_STREAM)
    except OSError:
        infos = []
    for info in infos:
        address = str(info[4][0])
        # A name that this node alone resolves to loopback (Debian's 127.0.1.1 for its own hostname) is reached by the
        # other nodes at another address: listen on every address instead.
        loopback = address.startswith("127.") or address == "::1"
        if address not in addresses and (not loopback or plan.hub_host in ("localhost", address)):
            addresses.append(address)
    return [f"tcp://{_bracket(a)}:{plan.port}" for a in addresses] + [f"tcp://0.0.0.0:{plan.port}"]
