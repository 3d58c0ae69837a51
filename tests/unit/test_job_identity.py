"""The job's identity: Slurm's ids from its variables, the Kubernetes pod from the kubelet's variables, the service
account's namespace file and the process's cgroup list (v1 and v2, both kubelet drivers); each id it cannot tell
absent with the reason (model/job_identity.py, run/identity.read_job_identity)."""

from __future__ import annotations

import pytest

from trainmeter_core.model import job_identity
from trainmeter_core.run.identity import read_job_identity

UID = "0c3b5e2a-1b2c-4d5e-8f90-123456789abc"
POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "trainer-0"}

CGROUP_SHAPES = {
    "v1, cgroupfs driver": (
        "12:memory:/kubepods/burstable/pod0c3b5e2a-1b2c-4d5e-8f90-123456789abc/4f7e9a\n"
        "11:cpu,cpuacct:/kubepods/burstable/pod0c3b5e2a-1b2c-4d5e-8f90-123456789abc/4f7e9a\n"
    ),
    "v1, cgroupfs driver, a guaranteed pod (no QoS folder)": (
        "4:memory:/kubepods/pod0c3b5e2a-1b2c-4d5e-8f90-123456789abc/4f7e9a\n"
    ),
    "v1, systemd driver": (
        "9:memory:/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod0c3b5e2a_1b2c_4d5e_8f90_123456789abc.slice/cri-containerd-4f7e9a.scope\n"
    ),
    "v2, systemd driver": (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod0c3b5e2a_1b2c_4d5e_8f90_123456789abc.slice/cri-containerd-4f7e9a.scope\n"
    ),
    "v2, cgroupfs driver": "0::/kubepods/besteffort/pod0c3b5e2a-1b2c-4d5e-8f90-123456789abc/4f7e9a\n",
    "hybrid: v1 lines and the v2 line": (
        "12:memory:/kubepods/burstable/pod0c3b5e2a-1b2c-4d5e-8f90-123456789abc/4f7e9a\n"
        "0::/kubepods/burstable/pod0c3b5e2a-1b2c-4d5e-8f90-123456789abc/4f7e9a\n"
    ),
}


@pytest.mark.parametrize("shape", sorted(CGROUP_SHAPES))
def test_the_pod_uid_is_read_from_every_cgroup_shape_the_kubelet_writes(shape):
    assert job_identity.pod_uid_in_cgroups(CGROUP_SHAPES[shape]) == UID


def test_a_cgroup_path_outside_kubepods_or_hidden_by_a_cgroup_namespace_has_no_pod_uid():
    # a Docker container's path names a pod-like folder but no kubepods: never taken for a pod
    assert job_identity.pod_uid_in_cgroups(f"0::/system.slice/pod{UID}/docker-1.scope\n") is None
    assert job_identity.pod_uid_in_cgroups("0::/\n") is None
    assert job_identity.cgroup_path_hidden("0::/\n") and job_identity.cgroup_path_hidden("3:cpu:/\n0::/\n")
    assert not job_identity.cgroup_path_hidden(CGROUP_SHAPES["v2, systemd driver"])


def test_a_slurm_step_of_an_array_job_gives_its_four_ids_each_with_its_variable():
    ids = job_identity.job_identity(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "3",
            "SLURM_ARRAY_JOB_ID": "4240",
            "SLURM_ARRAY_TASK_ID": "2",
        }
    )
    assert (ids.slurm_job_id, ids.slurm_step_id, ids.slurm_array_job_id, ids.slurm_array_task_id) == (
        "4242",
        "3",
        "4240",
        "2",
    )
    assert ids.sources["slurm_step_id"] == "SLURM_STEP_ID"
    assert set(ids.absent) == {"pod", "namespace", "pod_uid"}  # not in a pod
    assert job_identity.slurm_words(_plain(ids)) == "slurm 4242.3 (array 4240_2)"


def test_slurm_s_older_names_are_read_where_the_documented_ones_are_missing():
    ids = job_identity.job_identity({"SLURM_JOBID": "77", "SLURM_STEPID": "0"})
    assert (ids.slurm_job_id, ids.slurm_step_id) == ("77", "0")
    assert ids.sources == {"slurm_job_id": "SLURM_JOBID", "slurm_step_id": "SLURM_STEPID"}


def test_the_batch_script_has_no_step_and_a_job_that_is_no_array_no_array_ids_each_with_the_reason():
    ids = job_identity.job_identity({"SLURM_JOB_ID": "4242"})
    assert ids.slurm_job_id == "4242" and ids.slurm_step_id is None
    assert ids.absent["slurm_step_id"].startswith("no SLURM_STEP_ID: tm runs in the batch script itself")
    assert ids.absent["slurm_array_job_id"] == "not a job array: no SLURM_ARRAY_JOB_ID in the environment"
    assert ids.absent["slurm_array_task_id"] == "not a job array: no SLURM_ARRAY_TASK_ID in the environment"


def test_outside_slurm_and_kubernetes_every_id_is_absent_and_said_once_per_scheduler():
    ids = job_identity.job_identity({}, hostname="vm")
    assert all(getattr(ids, f) is None for f in (*job_identity.SLURM_FIELDS, *job_identity.KUBERNETES_FIELDS))
    assert job_identity.lines(_plain(ids)) == [
        "Slurm: n/a (not under Slurm: no SLURM_JOB_ID in the environment)",
        "Kubernetes: n/a (not in a Kubernetes pod: no KUBERNETES_SERVICE_HOST in the environment)",
    ]
    assert job_identity.short_words(_plain(ids)) == ""


def test_a_pod_is_named_by_hostname_its_namespace_by_the_service_account_file_its_uid_by_the_cgroup():
    ids = job_identity.job_identity(
        POD_ENV,
        namespace_text="ml-team\n",
        cgroup_text=CGROUP_SHAPES["v2, systemd driver"],
        namespace_file="/ns",
        cgroup_file="/cg",
    )
    assert (ids.pod, ids.namespace, ids.pod_uid) == ("trainer-0", "ml-team", UID)
    assert ids.sources == {"pod": "HOSTNAME", "namespace": "/ns", "pod_uid": "/cg"}
    assert ids.absent == dict.fromkeys(
        job_identity.SLURM_FIELDS, "not under Slurm: no SLURM_JOB_ID in the environment"
    )
    assert job_identity.pod_words(_plain(ids)) == "pod ml-team/trainer-0"


def test_the_downward_api_s_variables_win_over_what_tm_reads_itself():
    env = {**POD_ENV, "POD_NAME": "real-name", "POD_NAMESPACE": "from-env", "POD_UID": "uid-from-env"}
    ids = job_identity.job_identity(
        env, namespace_text="from-file", cgroup_text=CGROUP_SHAPES["v2, systemd driver"]
    )
    assert (ids.pod, ids.namespace, ids.pod_uid) == ("real-name", "from-env", "uid-from-env")
    assert ids.sources == {"pod": "POD_NAME", "namespace": "POD_NAMESPACE", "pod_uid": "POD_UID"}


def test_in_a_pod_with_no_token_and_a_cgroup_namespace_the_namespace_and_uid_are_absent_with_what_to_set():
    ids = job_identity.job_identity(
        POD_ENV,
        namespace_why="is not readable (No such file or directory)",
        cgroup_text="0::/\n",
        namespace_file="/ns",
        cgroup_file="/cg",
    )
    assert ids.pod == "trainer-0" and ids.namespace is None and ids.pod_uid is None
    assert ids.absent["namespace"] == (
        "no POD_NAMESPACE, and /ns is not readable (No such file or directory) (a pod that mounts no service account "
        "token): set POD_NAMESPACE from the downward API (fieldRef metadata.namespace)"
    )
    assert ids.absent["pod_uid"] == (
        "/cg shows the cgroup path as / (a cgroup namespace hides the pod's): set POD_UID from the downward API "
        "(fieldRef metadata.uid)"
    )
    lines = job_identity.lines(_plain(ids))
    assert "Kubernetes pod: trainer-0 (from HOSTNAME)" in lines
    assert any(line.startswith("Kubernetes pod uid: n/a (/cg shows the cgroup path as /") for line in lines)


def test_the_files_are_read_where_the_variables_point_and_the_arguments_win(tmp_path):
    cgroup, namespace = tmp_path / "cgroup", tmp_path / "namespace"
    cgroup.write_text(CGROUP_SHAPES["v1, cgroupfs driver"])
    namespace.write_text("ml-team")
    env = {**POD_ENV, "TM_CGROUP_FILE": str(cgroup), "TM_K8S_NAMESPACE_FILE": str(namespace)}
    ids = read_job_identity(env)
    assert (ids.namespace, ids.pod_uid) == ("ml-team", UID)
    assert ids.sources["namespace"] == str(namespace) and ids.sources["pod_uid"] == str(cgroup)
    other = tmp_path / "other-cgroup"
    other.write_text("0::/\n")
    assert read_job_identity(env, cgroup_file=str(other)).pod_uid is None
    missing = read_job_identity({**env, "TM_K8S_NAMESPACE_FILE": str(tmp_path / "none")})
    assert "is not readable (No such file or directory)" in missing.absent["namespace"]


def test_outside_a_pod_neither_file_is_read(tmp_path):
    # a cgroup file that would name a pod: outside a pod (no KUBERNETES_SERVICE_HOST) it is not even opened
    cgroup = tmp_path / "cgroup"
    cgroup.write_text(CGROUP_SHAPES["v1, cgroupfs driver"])
    ids = read_job_identity({"TM_CGROUP_FILE": str(cgroup)})
    assert ids.pod_uid is None and ids.absent["pod_uid"].startswith("not in a Kubernetes pod")


def test_a_run_recorded_before_tm_read_identities_says_so_in_one_line():
    assert job_identity.lines(None) == ["n/a (recorded before tm read the job's identity)"]
    assert job_identity.short_words(None) == ""


def _plain(ids) -> dict:
    from trainmeter_core.model import records

    return records.to_builtins(ids)
