"""The job hub's engine: each node's clock mapped onto the hub's, the per-node view, the straggler node, node_lost.

Pure tests: records in hub order (as the job hub writes them: its ``clock`` and ``node`` records before a node's own),
snapshots out. The hub's host is ``node0``; node 1's monotonic clock runs 1000 s ahead of it, node 2's 2000 s.
"""

from __future__ import annotations

import random

import pytest

from trainmeter_core.model import formulas, records
from trainmeter_core.model.alerts import NodeLost
from trainmeter_core.model.alerts.episodes import Alerter, rule_config
from trainmeter_core.model.engine import Engine, nodes

AHEAD_S = {"node1": 1000.0, "node2": 2000.0}
JOB = records.JobPlace(id="j", node_rank=0, nnodes=3, hub="10.0.0.1:29401", found_by="torchrun flags")


class Job:
    def __init__(self) -> None:
        self.records: list[records.Record] = []
        self.add(
            records.RunStart(
                t=100.0,
                host="node0",
                run_id="r0",
                name="job",
                run_dir="/r0",
                command=["torchrun"],
                cwd="/",
                tm_version="0",
                python="3.11",
                platform="linux",
                job=JOB,
            )
        )
        for rank, host in enumerate(("node0", "node1", "node2")):
            if host != "node0":
                node_rank = int(host[-1])
                self.add(
                    records.ClockMap(
                        t=100.5,
                        host="node0",
                        node_rank=node_rank,
                        node_host=host,
                        offset_s=-AHEAD_S[host],
                        basis="round_trip",
                        uncertainty_s=1e-4,
                    )
                )
                self.add(
                    records.NodeEvent(
                        t=100.5, host="node0", node_rank=node_rank, node_host=host, event="joined"
                    )
                )
            device = {"type": "cpu", "index": None, "uuid": None}
            self.add(
                records.Fact(
                    t=101.0 + AHEAD_S.get(host, 0.0),
                    host=host,
                    rank=rank,
                    name="device",
                    value=device,
                    provenance="detected",
                    origin="agent:model",
                )
            )

    def add(self, record: records.Record) -> records.Record:
        record.seq = len(self.records) + 1
        self.records.append(record)
        return record

    def step(self, host: str, rank: int, step: int, hub_t: float) -> None:
        """A step of ``rank`` on ``host`` at ``hub_t`` on the hub's clock, stamped with its own host's clock."""
        self.add(
            records.Step(t=hub_t + AHEAD_S.get(host, 0.0), host=host, rank=rank, step=step, step_time_s=1.0)
        )

    def tick(self, n: int, t: float) -> None:
        self.add(records.Tick(t=t, host="node0", n=n, interval_s=1.0))


def snapshots(logged: list[records.Record]) -> list[records.Snapshot]:
    engine = Engine()
    return [snap for record in logged for snap in engine.feed(record)]


def test_a_nodes_records_are_read_on_the_hubs_clock_and_the_straggler_is_the_node_that_reports_last():
    job = Job()
    for step in range(1, 11):
        base = 110.0 + step
        job.step("node0", 0, step, base)
        job.step("node1", 1, step, base + 0.01)  # 10 ms after node 0
        job.step("node2", 2, step, base + 0.25)  # 250 ms after node 0: the straggler
    job.tick(1, 121.0)
    (snap,) = snapshots(job.records)
    nodes = {n.host: n for n in snap.nodes}
    assert [n.node_rank for n in snap.nodes] == [0, 1, 2]
    # Every step of node 1 came 0.01 s after node 0's, node 2's 0.25 s after: an EMA of a constant is that constant.
    assert nodes["node1"].lag_s == pytest.approx(0.01) and nodes["node2"].lag_s == pytest.approx(0.25)
    assert nodes["node0"].lag_s == 0.0
    lag = snap.metrics["straggler_node_lag_s"]
    assert (lag.label, lag.value) == ("node2", pytest.approx(0.25))
    # Mapped: node 2's last step at 2000 + 120.25 on its clock is 120.25 on the hub's, 0.75 s before the tick.
    assert nodes["node2"].last_t == pytest.approx(120.25) and nodes["node2"].silent_s == pytest.approx(0.75)
    assert (nodes["node2"].clock_offset_s, nodes["node2"].clock_basis) == (-2000.0, "round_trip")
    assert {r.rank: (r.host, r.node, r.steps) for r in snap.ranks} == {
        0: ("node0", 0, 10),
        1: ("node1", 1, 10),
        2: ("node2", 2, 10),
    }
    # Global steps: rank 0's, not the sum over the nodes.
    assert snap.steps == 10
    assert snap.job == JOB


def test_a_nodes_lag_is_its_slowest_ranks_and_the_hosts_are_looked_over_once_a_host_per_step(monkeypatch):
    # Two ranks a node: a node's report of a step is its slowest rank's. Whether every host has reported is asked when
    # a host's last rank reports, not at every rank's report (a pass over the hosts each time grew as the job squared).
    asked = []
    hosts_stepping = nodes._hosts_stepping
    monkeypatch.setattr(
        nodes, "_hosts_stepping", lambda *args: asked.append(args[1]) or hosts_stepping(*args)
    )
    job = Job()
    for step in range(1, 11):
        base = 110.0 + step
        # Each node's first rank is its slowest (at step 1, before the second is known, it is the node's report)
        for host, rank, after in (("node0", 0, 0.002), ("node1", 1, 0.02), ("node2", 2, 0.3),
                                  ("node0", 3, 0.0), ("node1", 4, 0.01), ("node2", 5, 0.25)):  # fmt: skip
            job.step(host, rank, step, base + after)
    job.tick(1, 121.0)
    (snap,) = snapshots(job.records)
    lags = {n.host: n.lag_s for n in snap.nodes}
    # node 1's slowest rank 0.02 s after the start, node 0's 0.002 s, node 2's 0.3 s: 0.018 and 0.298 every step
    assert lags == {"node0": 0.0, "node1": pytest.approx(0.018), "node2": pytest.approx(0.298)}
    # Once a step, when the last host's last rank reports, and at step 1 once a host, as its ranks first appear (a
    # rank not yet known may bring a host the count of hosts has not seen): 13, where once a host a step asked 30
    assert len(asked) <= 10 + 3, len(asked)


def _mark_step_asking_at_every_host(state, host, rank, step, t):
    """The straggler's marks as ``nodes.mark_step`` kept them before it counted the hosts done (0872a51): every host
    looked over each time a host's last rank reports, the ranks of each host counted anew each time. The reference
    the counts must never change an answer of."""
    marks = state.step_marks.get(step)
    if marks is None:
        marks = state.step_marks[step] = {}
        if len(state.step_marks) > nodes.MAX_STEP_MARKS:
            del state.step_marks[min(state.step_marks)]
    count_key = host + "#n"
    marks[host] = max(marks.get(host, t), t)
    reported = marks[count_key] = marks.get(count_key, 0.0) + 1.0
    counts: dict[str, int] = {}  # every host's ranks, counted anew each time (none of nodes' caches)
    for rank_state in state.ranks.values():
        counts[rank_state.host] = counts.get(rank_state.host, 0) + 1
    if rank not in state.ranks:
        counts[host] = counts.get(host, 0) + 1
    if reported != counts[host]:
        return
    hosts = {
        name: n
        for name, n in counts.items()
        if name not in state.nodes or state.nodes[name].state in ("live", "behind")
    }
    if len(hosts) < 2 or any(marks.get(h + "#n", 0.0) < n for h, n in hosts.items()):
        return
    first = min(marks[h] for h in hosts)
    for h in hosts:
        node = state.nodes.get(h)
        lag = marks[h] - first
        if node is not None:
            node.lag_ema_s = formulas.ema(node.lag_ema_s, lag)
        else:
            state.own_lag_ema_s = formulas.ema(state.own_lag_ema_s, lag)
    del state.step_marks[step]


def _random_job(rng: random.Random) -> Job:
    """A job of 3 to 6 hosts, 1 to 3 ranks each, some of them first heard from late, reports of a step in any order
    (now and then one twice), and nodes that fall behind, are lost and come back between steps."""
    job = Job()
    hosts = ["node0", "node1", "node2"]
    for k in range(3, rng.randint(3, 6)):
        host = f"node{k}"
        hosts.append(host)
        job.add(records.ClockMap(t=100.5, host="node0", node_rank=k, node_host=host, offset_s=0.0,
                                 basis="round_trip", uncertainty_s=1e-4))  # fmt: skip
        job.add(records.NodeEvent(t=100.5, host="node0", node_rank=k, node_host=host, event="joined"))
    ranks, first_step = [], {}
    for host in hosts:
        for _ in range(rng.randint(1, 3)):
            first_step[len(ranks)] = 1 if rng.random() < 0.7 else rng.randint(2, 12)
            ranks.append((host, len(ranks)))
    for step in range(1, 25):
        base = 110.0 + step
        reports = [(host, rank) for host, rank in ranks if first_step[rank] <= step]
        reports += rng.sample(reports, k=1) if rng.random() < 0.1 else []
        rng.shuffle(reports)
        for host, rank in reports:
            job.step(host, rank, step, base + rng.random() * 0.3)
        if rng.random() < 0.3:
            host = rng.choice(hosts[1:])
            event = rng.choice(("behind", "lost", "resumed", "caught_up"))
            job.add(records.NodeEvent(t=base + 0.5, host="node0", node_rank=int(host[4:]), node_host=host,
                                      event=event, behind=3 if event == "behind" else None))  # fmt: skip
    return job


@pytest.mark.parametrize("seed", range(40))
def test_counting_the_hosts_done_changes_no_lag_of_a_job_of_any_shape(monkeypatch, seed):
    # The same records, once with the count of hosts done and once with every host looked over at each host's last
    # report: the lags, the straggler's marks still awaited (less the count's own key) and the snapshots the same.
    rng = random.Random(seed)
    job = _random_job(rng)
    job.tick(1, 140.0)

    def fed(mark_step) -> Engine:
        monkeypatch.setattr(nodes, "mark_step", mark_step)
        engine = Engine()
        for record in job.records:
            engine.feed(record)
        return engine

    counted, reference = fed(nodes.mark_step), fed(_mark_step_asking_at_every_host)
    lags = {host: node.lag_ema_s for host, node in reference.state.nodes.items()}
    assert lags == {host: node.lag_ema_s for host, node in counted.state.nodes.items()}
    assert counted.state.own_lag_ema_s == reference.state.own_lag_ema_s
    assert any(lag is not None for lag in lags.values())  # the job's steps were all reported at least once
    awaited = {
        step: {k: v for k, v in marks.items() if k != "#done"}
        for step, marks in counted.state.step_marks.items()
    }
    assert awaited == reference.state.step_marks


def test_unmapped_the_same_steps_would_make_node_two_two_thousand_seconds_late():
    # The control: the same records without the hub's clock records. Node 2 now looks 2000 s late.
    job = Job()
    job.records = [r for r in job.records if not isinstance(r, records.ClockMap)]
    for step in range(1, 4):
        for rank, host in enumerate(("node0", "node1", "node2")):
            job.step(host, rank, step, 110.0 + step)
    job.tick(1, 121.0)
    (snap,) = snapshots(job.records)
    assert snap.metrics["straggler_node_lag_s"].value == pytest.approx(2000.0)


def test_another_nodes_run_end_and_host_samples_never_pass_for_the_hubs():
    job = Job()
    job.step("node0", 0, 1, 111.0)
    job.add(records.SampleHost(t=2111.0, host="node2", root_pid=1, procs=3, cpu_cores=7.0))
    job.add(records.SampleHost(t=111.5, host="node0", root_pid=1, procs=3, cpu_cores=1.5))
    job.add(records.SampleHost(t=2112.0, host="node2", root_pid=1, procs=3, cpu_cores=9.0))
    job.add(records.RunEnd(t=2112.0, host="node2", status=0, reason="exited", elapsed_s=12.0))
    job.tick(1, 113.0)
    (snap,) = snapshots(job.records)
    assert not snap.final and snap.state == "running"
    assert snap.metrics["host_cpu_cores"].value == 1.5


def test_lost_behind_and_gap_show_per_node_and_node_lost_fires_once_per_episode():
    job = Job()
    job.tick(1, 101.0)
    job.add(
        records.NodeEvent(
            t=110.0,
            host="node0",
            node_rank=1,
            node_host="node1",
            event="lost",
            last_kind="step",
            last_t=104.0,
            silent_s=6.0,
            through=80,
        )
    )
    for n in range(2, 6):
        job.tick(n, 109.0 + n)
    job.add(
        records.NodeEvent(t=116.0, host="node0", node_rank=1, node_host="node1", event="resumed", through=80)
    )
    job.add(
        records.NodeEvent(
            t=116.0, host="node0", node_rank=1, node_host="node1", event="behind", through=80, behind=40
        )
    )
    job.add(
        records.NodeEvent(
            t=116.1, host="node0", node_rank=1, node_host="node1", event="gap", through=80, lost=7
        )
    )
    job.tick(6, 116.5)
    job.add(
        records.NodeEvent(
            t=117.0, host="node0", node_rank=1, node_host="node1", event="caught_up", through=120
        )
    )
    for n in range(7, 60):
        job.tick(n, 110.0 + n)
    snaps = snapshots(job.records)
    by_tick = {s.tick: {n.host: n for n in s.nodes} for s in snaps}
    assert by_tick[2]["node1"].state == "lost" and by_tick[2]["node1"].last_kind == "step"
    assert by_tick[2]["node1"].silent_s == pytest.approx(111.0 - 104.0)
    assert (
        snaps[1].metrics["node_lost.node1"].value == 1.0 and snaps[1].metrics["node_lost.node2"].value == 0.0
    )
    assert (by_tick[6]["node1"].state, by_tick[6]["node1"].behind) == ("behind", 40)
    assert (by_tick[6]["node1"].gaps, by_tick[6]["node1"].gap_records) == (1, 7)
    assert by_tick[7]["node1"].state == "live" and by_tick[7]["node1"].behind is None
    rule = NodeLost()
    alerts = Alerter([rule], {rule.name: rule_config(rule, {})})
    fired = [a for s in snaps for a in alerts.observe(s)]
    assert [(a.state, a.subject) for a in fired] == [("fired", "node1"), ("cleared", "node1")]
    assert "node 1 (node1) is lost" in fired[0].message and "a step record" in fired[0].message


def test_an_engine_restored_mid_job_continues_exactly():
    job = Job()
    for step in range(1, 6):
        job.step("node0", 0, step, 110.0 + step)
        job.step("node2", 2, step, 110.2 + step)
    job.tick(1, 116.0)
    half = len(job.records)
    for step in range(6, 9):
        job.step("node2", 2, step, 110.2 + step)
        job.step("node0", 0, step, 110.0 + step)
    job.tick(2, 120.0)
    whole = Engine()
    for record in job.records:
        last = whole.feed(record)
    first = Engine()
    for record in job.records[:half]:
        first.feed(record)
    restored = Engine.from_state(first.state_bytes())
    for record in job.records[half:]:
        again = restored.feed(record)
    assert again == last


def node_one_run(first_rank: int) -> list[records.Record]:
    """Node 1's own run of a 2-node job, as its launcher writes it: its ranks 2 and 3 (``first_rank`` of them reports
    each step first), 40 steps of 4096 tokens each, one a second from t 10, ending at t 50.5."""
    place = records.JobPlace(id="j", node_rank=1, nnodes=2, hub="10.0.0.1:29401", found_by="torchrun flags")
    logged: list[records.Record] = [
        records.RunStart(
            t=1.0,
            host="node1",
            run_id="r1",
            name="job",
            run_dir="/r1",
            command=["torchrun"],
            cwd="/",
            tm_version="0",
            python="3.11",
            platform="linux",
            job=place,
        )
    ]
    order = (first_rank, 5 - first_rank)
    for rank in order:
        logged.append(records.Phase(t=9.0, host="node1", rank=rank, phase="compile", start_t=2.0, end_t=8.0))
    for step in range(1, 41):
        for rank in order:
            logged.append(
                records.Step(
                    t=9.0 + step + 0.001 * rank,
                    host="node1",
                    rank=rank,
                    step=step,
                    step_time_s=1.0 if step > 1 else None,
                    tokens=2048,
                    dp=2,
                )
            )
        if step % 10 == 0:
            logged.append(records.Tick(t=9.5 + step, host="node1", n=step // 10, interval_s=1.0))
    logged.append(
        records.RunEnd(t=50.5, host="node1", status=0, reason="exited", exit_code=0, elapsed_s=49.5)
    )
    for seq, record in enumerate(logged, start=1):
        record.seq = seq
    return logged


@pytest.mark.parametrize("first_rank", [2, 3])
def test_a_nodes_own_run_counts_its_own_ranks_steps_and_rates_without_rank_0(first_rank):
    snap = snapshots(node_one_run(first_rank))[-1]
    assert snap.final and snap.job is not None and snap.job.node_rank == 1
    # The step clock is the node's first rank heard from: 40 steps, each of 2048 tokens × dp 2 = 4096.
    assert snap.steps == 40 and snap.tokens == 40 * 4096
    assert {r.rank: r.steps for r in snap.ranks} == {2: 40, 3: 40}
    # A step a second: the EMAs of constants are those constants; 4096 tokens / 1 s.
    assert snap.metrics["step_time_s"].value == pytest.approx(1.0)
    assert snap.metrics["tokens_per_s"].value == pytest.approx(4096.0)
    assert snap.explain["step_time_s"].formula.startswith(f"EMA of rank {first_rank}'s seconds per step")
    # since the last step: the run ended 0.5 s after step 40 (at 49 + 0.001 × rank)
    assert snap.metrics["since_step_s"].value == pytest.approx(50.5 - 49.0 - 0.001 * first_rank)
    # One rank's phases split the time (6 s of compile before the first step), not the two ranks' summed.
    assert snap.phases_s["compile"] == pytest.approx(6.0)
    assert snap.phases_s["startup"] == pytest.approx(10.0 + 0.001 * first_rank - 1.0 - 6.0)
    assert snap.phases_seen == {"compile": 1}


def test_a_nodes_step_clock_keeps_its_rank_series_and_survives_a_checkpoint():
    logged = node_one_run(2)
    engine = Engine()
    for record in logged[:40]:
        engine.feed(record)
    restored = Engine.from_state(engine.state_bytes())
    for record in logged[40:]:
        last = restored.feed(record)
    assert last == snapshots(logged)[-1:]
    names = restored.history.series_names()
    # The clock's step times under its rank's number (39 intervals, the checkpoint's with them: the first step has
    # none); no rank 0 on this node.
    assert "tm:rank:0:step_time_s" not in names
    assert restored.history.added_points("tm:rank:2:step_time_s") == 39


def test_a_nodes_own_run_keeps_the_loss_its_step_clocks_rank_read_at_backward():
    # Node 1's ranks 2 and 3 each read their own loss at backward(), just before their step: train_loss is the step
    # clock's (rank 2, heard from first), one point a step, and rank 3's stays in the log only.
    logged: list[records.Record] = []
    for record in node_one_run(2):
        if isinstance(record, records.Step):
            loss = (100.0 if record.rank == 3 else 1.0) + record.step
            logged.append(
                records.Metric(
                    values={"train_loss": loss},
                    origin="backward",
                    step=record.step,
                    t=record.t - 0.0005,
                    host="node1",
                    rank=record.rank,
                )
            )
        logged.append(record)
    for seq, record in enumerate(logged, start=1):
        record.seq = seq
    engine = Engine()
    for record in logged:
        engine.feed(record)
    assert [p.value for p in engine.history.query("train_loss", "step")] == [1.0 + s for s in range(1, 41)]
