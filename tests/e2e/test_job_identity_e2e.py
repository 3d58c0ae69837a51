"""A real ``tm`` run in a test's Slurm step of an array job, in a test's Kubernetes pod (the variables Slurm and the
kubelet set, a cgroup file and a service account namespace file that tm is pointed at): its ids are on the run
(``run.start``, ``meta.json``), in ``tm runs``, in ``tm runs RUN`` with the run's paid time, in the passport and in
``tm report``; the end of the run keeps its one summary line."""

from __future__ import annotations

import html
import json

from tm_runs import log_records, only_run, run_tm

from trainmeter_core.model import money

UID = "0c3b5e2a-1b2c-4d5e-8f90-123456789abc"
LOOP = """
import time
from trainmeter_agent import emit
for i in range(1, 31):
    emit(step=i, tokens=256)
    time.sleep(0.02)
"""
SCHEDULER_VARIABLES = ("SLURM_", "KUBERNETES_", "POD_", "TM_CGROUP_FILE", "TM_K8S_NAMESPACE_FILE")


def test_slurm_and_kubernetes_ids_reach_the_run_tm_runs_the_passport_and_the_report(tm_env, tmp_path):
    env = {k: v for k, v in tm_env.items() if not k.startswith(SCHEDULER_VARIABLES)}
    cgroup, namespace = tmp_path / "cgroup", tmp_path / "namespace"
    cgroup.write_text(f"12:memory:/kubepods/burstable/pod{UID}/4f7e9a\n0::/\n")  # a v1 line names the pod
    namespace.write_text("ml-team\n")
    env.update(
        SLURM_JOB_ID="4242",
        SLURM_STEP_ID="3",
        SLURM_ARRAY_JOB_ID="4240",
        SLURM_ARRAY_TASK_ID="2",
        KUBERNETES_SERVICE_HOST="10.96.0.1",
        HOSTNAME="trainer-0",
        TM_CGROUP_FILE=str(cgroup),
        TM_K8S_NAMESPACE_FILE=str(namespace),
        TM_DISABLE_COMPONENTS="web",
        TM_FAKE_GPUS="1xH100",
    )
    loop = tmp_path / "loop.py"
    loop.write_text(LOOP)
    done = run_tm([str(loop)], env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    finished = [line for line in done.stderr.splitlines() if line.startswith("tm: finished")]
    assert len(finished) == 1  # the end keeps its one summary line
    run_dir = only_run(tmp_path / "runs")
    expected = {
        "slurm_job_id": "4242",
        "slurm_step_id": "3",
        "slurm_array_job_id": "4240",
        "slurm_array_task_id": "2",
        "pod": "trainer-0",
        "namespace": "ml-team",
        "pod_uid": UID,
    }
    # on the run: its run.start record and meta.json, each id with where it was read
    (start,) = [r for r in log_records(run_dir) if r["kind"] == "run.start"]
    meta = json.loads((run_dir / "meta.json").read_text())
    for ids in (start["job_identity"], meta["job_identity"]):
        assert {k: ids.get(k) for k in expected} == expected
        assert ids["sources"]["namespace"] == str(namespace) and ids["sources"]["pod_uid"] == str(cgroup)
        assert "absent" not in ids
    # tm runs: the line ends with the ids as sacct and kubectl name them
    listed = run_tm(["runs"], env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    assert line.endswith("  slurm 4242.3 (array 4240_2)  pod ml-team/trainer-0")
    # tm runs RUN: the ids, then the paid time, one figure a line
    one = run_tm(["runs", run_dir.name], env, cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert lines[:2] == [f"Run: {run_dir.name}", "State: finished (exit 0)"]
    assert (
        "Slurm job: 4242 (from SLURM_JOB_ID)" in lines
        and "Slurm array task: 2 (from SLURM_ARRAY_TASK_ID)" in lines
    )
    assert f"Kubernetes pod uid: {UID} (from {cgroup})" in lines
    assert any(x.startswith("GPU-hours allocated: ") for x in lines)
    assert f"Money: n/a ({money.NO_PRICE})" in lines
    assert any(x.startswith("Goodput: ") and x.endswith("%") for x in lines)
    # the passport and the report (its static view shows the passport, then the paid time)
    passport = (run_dir / "passport.md").read_text()
    assert "## Job" in passport and "- Kubernetes namespace: ml-team (from " in passport
    report = run_tm(["report", run_dir.name, "-o", "-"], env, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    shown = html.unescape(report.stdout)
    for said in (
        "- Slurm job: 4242 (from SLURM_JOB_ID)",
        "- Kubernetes pod: trainer-0 (from HOSTNAME)",
        f"- Kubernetes pod uid: {UID}",
        "## Paid time",
        "- Money: n/a (no price given: --price-per-gpu-hour",
    ):
        assert said in shown, said  # fmt: skip


def test_a_run_outside_any_scheduler_says_why_each_is_absent(tm_env, tmp_path):
    env = {k: v for k, v in tm_env.items() if not k.startswith(SCHEDULER_VARIABLES)}
    env["TM_DISABLE_COMPONENTS"] = "web"
    loop = tmp_path / "loop.py"
    loop.write_text(LOOP.replace("range(1, 31)", "range(1, 4)"))
    done = run_tm([str(loop)], env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = only_run(tmp_path / "runs")
    ids = json.loads((run_dir / "meta.json").read_text())["job_identity"]
    assert ids["absent"]["slurm_job_id"] == "not under Slurm: no SLURM_JOB_ID in the environment"
    assert ids["absent"]["pod"] == "not in a Kubernetes pod: no KUBERNETES_SERVICE_HOST in the environment"
    (line,) = run_tm(["runs"], env, cwd=tmp_path).stdout.splitlines()
    assert line.endswith("steps")  # nothing follows where no scheduler ran the job
    lines = run_tm(["runs", run_dir.name], env, cwd=tmp_path).stdout.splitlines()
    assert "Slurm: n/a (not under Slurm: no SLURM_JOB_ID in the environment)" in lines
