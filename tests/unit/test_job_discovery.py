"""How a run finds its job: tm's flags, torchrun's flags and variables, the MASTER_ADDR/NODE_RANK environment, Slurm.

Pure tests of trainmeter_core.run.job_discovery.discover: a command line and an environment in, a place out (or
JobUnjoinable with a one-line reason). Nothing binds or connects here; test_multinode.py runs a job found this way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmeter_core.run import job_discovery

HOME = {"HOME": "/home/u"}


def test_torchrun_flags_give_the_place_and_the_hub_one_port_above_the_rendezvous():
    plan = job_discovery.discover(
        [
            "torchrun",
            "--nnodes",
            "3",
            "--node_rank=2",
            "--rdzv-endpoint",
            "10.1.2.3:29400",
            "train.py",
            "--nnodes",
            "9",
        ],
        HOME,
    )
    assert isinstance(plan, job_discovery.JobPlan)
    # The script's own --nnodes 9 is the script's: torchrun's options end at the script.
    assert (plan.place.node_rank, plan.place.nnodes, plan.place.found_by) == (2, 3, "torchrun flags")
    assert plan.place.hub == "10.1.2.3:29401" and plan.connect_endpoint == "tcp://10.1.2.3:29401"
    assert plan.place.id == "10.1.2.3:29401"
    assert plan.keys_dir == Path("/home/u/.trainmeter/jobs/10.1.2.3_29401")


def test_master_addr_and_port_flags_and_the_module_form_of_torchrun():
    plan = job_discovery.discover(
        [
            "python",
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--node-rank",
            "1",
            "--master_addr",
            "head",
            "--master-port",
            "6000",
            "--rdzv_id",
            "exp7",
            "train.py",
        ],
        HOME,
    )
    assert isinstance(plan, job_discovery.JobPlan)
    assert (plan.hub_host, plan.port, plan.place.id) == ("head", 6001, "torchrun-exp7")


def test_an_endpoint_without_a_port_takes_torchruns_default():
    plan = job_discovery.discover(
        ["torchrun", "--nnodes", "2", "--node_rank", "0", "--rdzv_endpoint", "head", "t.py"], HOME
    )
    assert isinstance(plan, job_discovery.JobPlan) and plan.port == job_discovery.C10D_DEFAULT_PORT + 1


def test_torchruns_pet_variables_stand_for_its_flags():
    env = {**HOME, "PET_NNODES": "1:4", "PET_NODE_RANK": "3", "PET_RDZV_ENDPOINT": "[fd00::1]:7000"}
    plan = job_discovery.discover(["torchrun", "--standalone", "train.py"], env)
    assert isinstance(plan, job_discovery.JobPlan)
    # An elastic 1:4 may grow to 4 nodes: the allow-list covers them all.
    assert (plan.place.nnodes, plan.place.node_rank, plan.connect_endpoint) == (4, 3, "tcp://[fd00::1]:7001")


def test_the_environment_alone_names_the_job():
    env = {**HOME, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456", "NODE_RANK": "1", "NNODES": "2"}
    plan = job_discovery.discover(["python", "train.py"], env)
    assert isinstance(plan, job_discovery.JobPlan)
    assert (plan.hub_host, plan.port, plan.place.found_by, plan.place.node_rank) == (
        "10.0.0.1",
        23457,
        "environment",
        1,
    )


def test_slurm_gives_rank_count_id_and_the_first_host_of_its_node_list():
    env = {
        **HOME,
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NODELIST": "gpu[007-009,012],login1",
    }
    plan = job_discovery.discover(["python", "train.py"], env)
    assert isinstance(plan, job_discovery.JobPlan)
    # 41000 + 123456 mod 10000 = 41000 + 3456
    assert (plan.hub_host, plan.port, plan.place.id, plan.place.node_rank, plan.place.nnodes) == (
        "gpu007",
        44456,
        "slurm-123456",
        2,
        4,
    )


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("n1", "n1"),
        ("n[1-4]", "n1"),
        ("rack[2-3]-n[01-08]", "rack2-n01"),
        ("a[5,7],b[1-2]", "a5"),
        ("x,y", "x"),
    ],
)
def test_the_first_host_of_a_slurm_node_list(nodelist, first):
    assert job_discovery.slurm_first_host(nodelist) == first


def test_tms_own_flags_win_and_name_what_is_missing():
    plan = job_discovery.discover(
        ["python", "t.py"], HOME, job="head:5000", node_rank=1, nnodes=2, keys_dir="/shared/k"
    )
    assert isinstance(plan, job_discovery.JobPlan)
    assert (plan.place.found_by, plan.port, plan.keys_dir) == ("--job", 5000, Path("/shared/k"))
    with pytest.raises(job_discovery.JobUnjoinable) as missing_rank:
        job_discovery.discover(["python", "t.py"], HOME, job="head:5000", nnodes=2)
    assert (
        str(missing_rank.value) == "job head:5000 (--job) but this node's rank is unknown: pass --node-rank K"
    )
    with pytest.raises(job_discovery.JobUnjoinable, match="HOST:PORT"):
        job_discovery.discover(["python", "t.py"], HOME, job="head", node_rank=0, nnodes=2)
    with pytest.raises(job_discovery.JobUnjoinable, match="pass --nnodes N"):
        job_discovery.discover(["python", "t.py"], HOME, job="head:1", node_rank=0)
    with pytest.raises(job_discovery.JobUnjoinable, match="outside the job's 2 nodes"):
        job_discovery.discover(["python", "t.py"], HOME, job="h:1", node_rank=2, nnodes=2)


def test_a_single_node_run_finds_no_job():
    assert job_discovery.discover(["python", "train.py"], HOME) is None
    assert (
        job_discovery.discover(["torchrun", "--standalone", "--nproc_per_node=2", "train.py"], HOME) is None
    )
    assert (
        job_discovery.discover(["torchrun", "--nnodes", "1", "--rdzv-endpoint", "h:1", "t.py"], HOME) is None
    )
    # Slurm with one node, or torchrun's one-node default: nothing to join.
    assert (
        job_discovery.discover(
            ["python", "t.py"], {**HOME, "SLURM_JOB_ID": "5", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
        )
        is None
    )


def test_the_keys_folder_is_tm_job_keys_when_set():
    env = {**HOME, "TM_JOB_KEYS": "/nfs/keys"}
    plan = job_discovery.discover(
        ["torchrun", "--nnodes", "2", "--node_rank", "0", "--rdzv-endpoint", "h:1", "t.py"], env
    )
    assert isinstance(plan, job_discovery.JobPlan) and plan.keys_dir == Path("/nfs/keys")


def test_the_hub_listens_on_the_rendezvous_address_else_everywhere_never_on_a_loopback_alias(monkeypatch):
    plan = job_discovery.discover(
        ["torchrun", "--nnodes", "2", "--node_rank", "0", "--rdzv-endpoint", "127.0.0.1:9", "t.py"], HOME
    )
    assert isinstance(plan, job_discovery.JobPlan)
    assert job_discovery.bind_endpoints(plan) == ["tcp://127.0.0.1:10", "tcp://0.0.0.0:10"]
    # Debian maps a machine's own name to 127.0.1.1 (/etc/hosts); the other nodes reach it at another address, so
    # the hub listens on every address rather than on that alias.
    monkeypatch.setattr(
        job_discovery.socket, "getaddrinfo", lambda host, port, type=0: [(2, 1, 6, "", ("127.0.1.1", port))]
    )
    alias = job_discovery.JobPlan(place=plan.place, hub_host="head", port=10, keys_dir=plan.keys_dir)
    assert job_discovery.bind_endpoints(alias) == ["tcp://0.0.0.0:10"]
