"""Where the ``job`` and ``node`` labels of every exported series come from: one place, so that a multi-node run's
own job and node identity replaces the single-node one here and nowhere else.

Pure: it reads the run's ``meta.json`` mapping and record headers it is given; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Identity:
    """The run's place in a fleet: ``job`` (one training job, all its nodes) and ``node`` (this node)."""

    job: str
    node: str

    def node_of(self, host: str | None) -> str:
        """The node label of a record: its own host (a record forwarded from another node keeps its node), else
        this node's."""
        return host or self.node


def identity(meta: Mapping[str, Any]) -> Identity:
    """The job and node labels of a run, from its ``meta.json``.

    A node of a job of several nodes carries the job in ``meta.json`` (``job.id``: the rendezvous id, Slurm's job id or
    the job hub's address, the same on every node), so each node's exporter labels its series with the one job. A
    single-node run is a job of one node: the job is the run's id (``<UTC time>-<host>-<name>``, unique, printed at
    the start and the name of its run directory). The node is the host name either way, as in the job's own records.
    """
    node = str(meta.get("host") or "")
    place = meta.get("job")
    if isinstance(place, Mapping) and place.get("id"):
        return Identity(job=str(place["id"]), node=node)
    job = str(meta.get("run_id") or meta.get("name") or "")
    return Identity(job=job, node=node)


#: The scheduler's ids a run keeps in ``meta.json`` (``job_identity``) and the ``trainmeter_run_info`` label each
#: becomes. ``namespace`` and ``pod`` are the names kube-state-metrics and cAdvisor use, so a join needs no renaming.
SCHEDULER_LABELS = {
    "slurm_job_id": "slurm_job_id",
    "slurm_step_id": "slurm_step_id",
    "slurm_array_job_id": "slurm_array_job_id",
    "slurm_array_task_id": "slurm_array_task_id",
    "namespace": "namespace",
    "pod": "pod",
    "pod_uid": "pod_uid",
}


def scheduler_labels(meta: Mapping[str, Any]) -> dict[str, str]:
    """The Slurm and Kubernetes ids of the run as labels of ``trainmeter_run_info``: only those the run could read
    (an absent id is no label, never an empty one; ``tm runs RUN`` says why it is absent)."""
    ids = meta.get("job_identity")
    if not isinstance(ids, Mapping):
        return {}
    return {label: str(ids[field]) for field, label in SCHEDULER_LABELS.items() if ids.get(field)}
