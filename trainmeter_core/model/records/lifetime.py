"""The run's lifetime: ``run.start`` and ``run.end`` from the launcher, ``hello`` and ``bye`` from each producer, and
``component`` for tm's own processes coming and going. Each kind is defined here once; the package's face puts it
in the union. Pure: no I/O, no clock.
"""

# Annotations are evaluated at import, as header.py says why.
from typing import Literal

import msgspec

from trainmeter_core.model.records.header import Record

#: Version of the agent <-> launcher protocol, carried in ``hello``.
#: 2: the agent sends its records in windows, which the hub turns into records.
#: 3: the agent sends its steady steps, losses, data waits and metrics as ``block`` records (``records/block.py``).
PROTOCOL_VERSION = 3


class PluginInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    group: str
    distribution: str | None = None
    version: str | None = None
    provides: list[str] = []
    error: str | None = None


class JobPlace(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a run sits in a job of several nodes (docs/multinode.md): the job's id, this node's rank among ``nnodes``,
    the job hub's address (node rank 0 hosts it) and how tm found all this out."""

    id: str  # the rendezvous id, Slurm's job id, or the job hub's address
    node_rank: int
    nnodes: int
    hub: str  # "HOST:PORT"
    found_by: str  # "torchrun flags", "environment", "slurm", "--job"


class JobIdentity(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Who the scheduler says the run is: Slurm's job, step and array ids, and the Kubernetes pod, its namespace and
    uid, each as read without root (``run/identity.read_job_identity``; docs/job-identity.md says from where). An id
    that could not be read is in ``absent`` with the reason; ``sources`` names where each id was read."""

    slurm_job_id: str | None = None
    slurm_step_id: str | None = None
    slurm_array_job_id: str | None = None
    slurm_array_task_id: str | None = None
    pod: str | None = None
    namespace: str | None = None
    pod_uid: str | None = None
    sources: dict[str, str] = {}  # field -> the variable or file it was read from
    absent: dict[str, str] = {}  # field -> why it is unknown


class RunStart(Record, tag="run.start", kw_only=True):
    """Written first by the launcher, once the hub is bound and the child started. ``job`` is set on every node of a
    job of several nodes; on the job hub's node (rank 0) the run holds the whole job."""

    run_id: str
    name: str
    run_dir: str
    command: list[str]  # secrets redacted
    cwd: str
    child_pid: int | None = None
    tm_version: str
    python: str
    platform: str
    env: dict[str, str] = {}  # the variables that shape a run (CUDA_VISIBLE_DEVICES, ...), secrets redacted
    agent: bool = True
    slurm: bool = False
    plugins: list[PluginInfo] = []
    job: JobPlace | None = None
    job_identity: JobIdentity | None = (
        None  # the scheduler's ids (Slurm, Kubernetes), read when the run started
    )
    # 1 for a run's first start; a resumed run (``tm --resume``) counts its attempts on in the same log
    attempt: int = 1
    resume_reason: str | None = (
        None  # why this start continues the run: "--resume", or the checkpoint it matched
    )


class RunEnd(Record, tag="run.end", kw_only=True):
    """Written last by the launcher. ``status`` is tm's own exit status (the child's, or 128+N for signal N)."""

    status: int
    reason: Literal["exited", "signaled", "not_found", "not_executable", "launcher_error", "detached"]
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    elapsed_s: float
    steps: int = 0


class Hello(Record, tag="hello", kw_only=True):
    """The agent's first word from a Python process of the run."""

    protocol: int  # required, so it is always on the wire (a default would be omitted)
    agent_version: str
    python: str
    executable: str
    argv: list[str]  # secrets redacted
    ppid: int
    role: Literal["trainer", "launcher", "worker", "other"] = "trainer"
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    trackers: list[str] = []  # tracker taps the agent may attach


class Bye(Record, tag="bye", kw_only=True):
    """A producer's last record: sent on close, after every other one, so its ``dropped`` is final."""

    sent: int
    reason: str = "exit"


class Component(Record, tag="component", kw_only=True):
    """Supervision of tm's own component processes."""

    name: str
    event: Literal["started", "crashed", "restarted", "stopped", "gave_up", "error"]
    process: str  # the placement: "components" or the component's own process name
    child_pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    backoff_s: float | None = None
    error: str | None = None
