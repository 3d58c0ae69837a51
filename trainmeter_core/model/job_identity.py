"""The job's identity as its scheduler knows it: Slurm's job, step and array ids and the Kubernetes pod, its namespace
and uid, made from the environment and the texts of two files the caller read (the process's cgroup list and the
service account's namespace file). Each id it cannot tell is absent with the reason, never guessed.

Pure: no I/O. ``run/identity.read_job_identity`` reads the files; docs/job-identity.md says what comes from where.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainmeter_core.model import records

#: The service account's namespace file, mounted in every pod that mounts its service account token.
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: The process's cgroups: one line per hierarchy, ``ID:CONTROLLERS:PATH`` (cgroup v2's one line is ``0::PATH``).
CGROUP_FILE = "/proc/self/cgroup"

SLURM_FIELDS = ("slurm_job_id", "slurm_step_id", "slurm_array_job_id", "slurm_array_task_id")
KUBERNETES_FIELDS = ("pod", "namespace", "pod_uid")

#: Each Slurm id and the variables it is read from, the documented name first (Slurm still sets the older one).
SLURM_VARIABLES = {
    "slurm_job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "slurm_step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "slurm_array_job_id": ("SLURM_ARRAY_JOB_ID",),
    "slurm_array_task_id": ("SLURM_ARRAY_TASK_ID",),
}
#: Variables a pod's spec sets from the downward API (``fieldRef``), which win over what tm reads for itself.
DOWNWARD_API = {"pod": "POD_NAME", "namespace": "POD_NAMESPACE", "pod_uid": "POD_UID"}

# A pod's folder in a kubelet cgroup path, in both drivers' shapes: cgroupfs writes ``/kubepods/burstable/pod<uid>/``,
# systemd ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _ for ->.slice/``. Compiled at
# its first use (re caches it), inside a pod only: every run's start imports this module.
_POD_FOLDER = (
    r"[/-]pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)


def slurm_ids(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Slurm's ids from the environment: (values, sources, absent reasons)."""
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    absent: dict[str, str] = {}
    for field, names in SLURM_VARIABLES.items():
        name = next((n for n in names if environ.get(n)), None)
        if name is not None:
            values[field], sources[field] = environ[name].strip(), name
    if "slurm_job_id" not in values:
        for field in SLURM_FIELDS:
            absent[field] = "not under Slurm: no SLURM_JOB_ID in the environment"
        return {}, {}, absent
    if "slurm_step_id" not in values:
        absent["slurm_step_id"] = (
            "no SLURM_STEP_ID: tm runs in the batch script itself, not in a step srun started"
        )
    for field in ("slurm_array_job_id", "slurm_array_task_id"):
        if field not in values:
            absent[field] = f"not a job array: no {SLURM_VARIABLES[field][0]} in the environment"
    return values, sources, absent


def in_a_pod(environ: Mapping[str, str]) -> bool:
    """Whether the process runs in a Kubernetes pod: the kubelet puts ``KUBERNETES_SERVICE_HOST`` in every
    container's environment; a downward-API variable says so too."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) or any(environ.get(v) for v in DOWNWARD_API.values())


def pod_uid_in_cgroups(text: str) -> str | None:
    """The pod uid in a ``/proc/<pid>/cgroup`` text, cgroup v1 or v2, either kubelet driver; None when no line holds
    a kubelet pod folder (a cgroup namespace shows ``0::/``). The v2 line is read first where both are."""
    lines = text.splitlines()
    ordered = [x for x in lines if x.startswith("0::")] + [x for x in lines if not x.startswith("0::")]
    for line in ordered:
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        found = re.search(_POD_FOLDER, path)
        if found is not None:
            return found.group(1).replace("_", "-")
    return None


def cgroup_path_hidden(text: str) -> bool:
    """Every line's path is ``/``: a cgroup namespace (cgroup v2's default under containerd and CRI-O) hides it."""
    paths = [line.split(":", 2)[-1].strip() for line in text.splitlines() if line.count(":") >= 2]
    return bool(paths) and all(p == "/" for p in paths)


def kubernetes_ids(
    environ: Mapping[str, str],
    hostname: str | None,
    namespace_text: str | None,
    namespace_why: str | None,
    cgroup_text: str | None,
    cgroup_why: str | None,
    namespace_file: str = NAMESPACE_FILE,
    cgroup_file: str = CGROUP_FILE,
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The pod, its namespace and uid: (values, sources, absent reasons). ``*_text`` is a file's text as read, or None
    with ``*_why`` saying why it could not be; ``hostname`` is the host's name, which in a pod is the pod's."""
    if not in_a_pod(environ):
        why = "not in a Kubernetes pod: no KUBERNETES_SERVICE_HOST in the environment"
        return {}, {}, dict.fromkeys(KUBERNETES_FIELDS, why)
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    absent: dict[str, str] = {}
    for field, variable in DOWNWARD_API.items():
        if environ.get(variable):
            values[field], sources[field] = environ[variable].strip(), variable
    if "pod" not in values:
        if environ.get("HOSTNAME"):
            values["pod"], sources["pod"] = environ["HOSTNAME"].strip(), "HOSTNAME"
        elif hostname:
            values["pod"], sources["pod"] = hostname, "the host name"
        else:
            absent["pod"] = "no POD_NAME or HOSTNAME in the environment"
    if "namespace" not in values:
        name = (namespace_text or "").strip()
        if name:
            values["namespace"], sources["namespace"] = name, namespace_file
        else:
            absent["namespace"] = (
                f"no POD_NAMESPACE, and {namespace_file} {namespace_why or 'is empty'} (a pod that mounts no "
                "service account token): set POD_NAMESPACE from the downward API (fieldRef metadata.namespace)"
            )
    if "pod_uid" not in values:
        uid = pod_uid_in_cgroups(cgroup_text) if cgroup_text is not None else None
        if uid is not None:
            values["pod_uid"], sources["pod_uid"] = uid, cgroup_file
        else:
            if cgroup_text is None:
                seen = f"{cgroup_file} {cgroup_why or 'is not readable'}"
            elif cgroup_path_hidden(cgroup_text):
                seen = f"{cgroup_file} shows the cgroup path as / (a cgroup namespace hides the pod's)"
            else:
                seen = f"no kubepods pod folder in {cgroup_file}"
            absent["pod_uid"] = f"{seen}: set POD_UID from the downward API (fieldRef metadata.uid)"
    return values, sources, absent


def job_identity(
    environ: Mapping[str, str],
    *,
    hostname: str | None = None,
    namespace_text: str | None = None,
    namespace_why: str | None = None,
    cgroup_text: str | None = None,
    cgroup_why: str | None = None,
    namespace_file: str = NAMESPACE_FILE,
    cgroup_file: str = CGROUP_FILE,
) -> records.JobIdentity:
    """Every id, from the environment and the two files' texts (see ``kubernetes_ids``)."""
    slurm, slurm_from, slurm_absent = slurm_ids(environ)
    pod, pod_from, pod_absent = kubernetes_ids(
        environ, hostname, namespace_text, namespace_why, cgroup_text, cgroup_why, namespace_file, cgroup_file
    )
    return records.JobIdentity(
        **slurm, **pod, sources={**slurm_from, **pod_from}, absent={**slurm_absent, **pod_absent}
    )


# ----------------------------------------------------------------------------------------------------------------------
# In words: `tm runs`, the passport, the report (each from the plain data meta.json and passport.json hold)


def slurm_words(ids: Mapping[str, Any]) -> str | None:
    """``slurm 4242.0 (array 4240_7)``: Slurm's ids as ``sacct`` and ``seff`` name a step; None when not under Slurm."""
    job = ids.get("slurm_job_id")
    if not job:
        return None
    words = f"slurm {job}" + (f".{ids['slurm_step_id']}" if ids.get("slurm_step_id") else "")
    if ids.get("slurm_array_job_id") and ids.get("slurm_array_task_id") is not None:
        words += f" (array {ids['slurm_array_job_id']}_{ids['slurm_array_task_id']})"
    return words


def pod_words(ids: Mapping[str, Any]) -> str | None:
    """``pod NAMESPACE/NAME``, as kubectl names a pod; None outside a pod."""
    pod, namespace = ids.get("pod"), ids.get("namespace")
    if not pod and not namespace:
        return None
    return f"pod {namespace or '?'}/{pod or '?'}"


def short_words(ids: Mapping[str, Any] | None) -> str:
    """The identity in a ``tm runs`` line: Slurm's and the pod's, or nothing."""
    if not ids:
        return ""
    return "  ".join(w for w in (slurm_words(ids), pod_words(ids)) if w)


#: Each id in words, in the order a reader looks for them.
FIELD_WORDS = {
    "slurm_job_id": "Slurm job",
    "slurm_step_id": "Slurm step",
    "slurm_array_job_id": "Slurm array job",
    "slurm_array_task_id": "Slurm array task",
    "namespace": "Kubernetes namespace",
    "pod": "Kubernetes pod",
    "pod_uid": "Kubernetes pod uid",
}


def lines(ids: Mapping[str, Any] | None) -> list[str]:
    """One line per id: its value and where it was read, or why it is unknown; a scheduler the run was not under is
    said once (``Slurm: n/a (not under Slurm: ...)``); one line for a run recorded before tm read them."""
    if ids is None:
        return ["n/a (recorded before tm read the job's identity)"]
    sources, absent = ids.get("sources") or {}, ids.get("absent") or {}
    out = []
    for group, fields in (("Slurm", SLURM_FIELDS), ("Kubernetes", KUBERNETES_FIELDS)):
        reasons = {absent.get(f) for f in fields}
        if len(reasons) == 1 and None not in reasons:  # every id of the scheduler absent for one reason
            out.append(f"{group}: n/a ({reasons.pop()})")
            continue
        for field in fields:
            if ids.get(field) is not None:
                out.append(f"{FIELD_WORDS[field]}: {ids[field]} (from {sources.get(field, '?')})")
            else:
                out.append(f"{FIELD_WORDS[field]}: n/a ({absent.get(field, 'not read')})")
    return out
