"""The loss without a line of code: the agent reads the 0-dim tensor passed to ``backward()`` as ``train_loss``, the
engine lets a tracker's or emit()'s own loss win over it, and the training stays bit-identical
(tests/agent_scripts/gpt_loop.py: no tracker, no emit).
"""

from __future__ import annotations

import json
import re
import struct

import pytest
from deadline import wait_for
from test_agent import kinds, tm_lines
from test_agent_depth import _same_run, facts

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.runlog.reader import read_log

heavy = pytest.mark.xdist_group("heavy")


def backward_losses(logged: list[dict]) -> dict[int, float]:
    """step -> train_loss, from the agent's metrics of origin ``backward``."""
    found: dict[int, float] = {}
    for metric in kinds(logged, "metric"):
        if metric.get("origin") == "backward":
            assert metric["step"] not in found  # one value per iteration
            found[metric["step"]] = metric["values"]["train_loss"]
    return found


def ulp32(x: float) -> float:
    """The distance from float32 ``x`` to the next float32 away from zero."""
    bits = struct.unpack("<I", struct.pack("<f", abs(x)))[0]
    return struct.unpack("<f", struct.pack("<I", bits + 1))[0] - abs(x)


# --------------------------------------------------------------------------------------------------------------------
# Acceptance: the value is the loop's own loss, and the run is the same as without tm


@heavy
def test_with_one_micro_batch_train_loss_is_the_printed_loss_exactly_and_the_run_is_unchanged(
    run, torch, tmp_path
):
    measured, extra, _ = _same_run(tmp_path, run, ["--steps", "30"])
    assert extra == []
    logged = run.records()
    losses = backward_losses(logged)
    printed = [float.fromhex(h) for h in measured["losses"]]
    assert sorted(losses) == list(range(1, 31))
    # loss / 1 is the loss itself: the value passed to backward, bit for bit.
    assert [losses[step] for step in range(1, 31)] == printed
    found = facts(logged)
    assert found["probe.loss"]["value"] == "attached"
    assert found["loss_from_backward"]["value"] == 1
    assert "assumes" not in found["loss_from_backward"]["note"]


@heavy
def test_with_four_micro_batches_train_loss_is_their_mean_within_one_float32_ulp(run, torch, tmp_path):
    measured, extra, _ = _same_run(tmp_path, run, ["--steps", "12", "--accum", "4"])
    assert extra == []
    logged = run.records()
    losses = backward_losses(logged)
    assert sorted(losses) == list(range(1, 13))
    for step, micro in enumerate(measured["micro_losses"], start=1):
        # The loop passes loss_i / 4 to backward for each of its 4 micro-batches; their sum is the mean of the 4.
        mean = sum(float.fromhex(h) for h in micro) / 4
        assert abs(losses[step] - mean) <= ulp32(mean), (step, losses[step], mean)
    label = facts(logged)["loss_from_backward"]
    assert label["value"] == 4
    assert "assumes the loop divides each micro-batch loss by 4" in label["note"]


@heavy
def test_with_a_grad_scaler_train_loss_is_the_unscaled_loss(run, torch, tmp_path):
    # A scale of 2**16 on the CPU: the tensor passed to backward is loss x 65536; the agent reads the loss before it.
    measured, extra, _ = _same_run(tmp_path, run, ["--steps", "10", "--scaler", "65536"])
    assert extra == []
    losses = backward_losses(run.records())
    assert [losses[step] for step in range(1, 11)] == [float.fromhex(h) for h in measured["losses"]]


@heavy
def test_a_loss_that_is_not_0_dim_is_absent_and_the_probe_says_why(run, torch):
    code = (
        "import torch\ntorch.set_num_threads(1)\n"
        "w = torch.nn.Parameter(torch.ones(3))\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n    (w * 2).backward(torch.ones(3))\n    opt.step()\n"
    )
    done = run.python(["-c", code], run.env())
    assert tm_lines(done.stderr) == []
    logged = run.records()
    assert backward_losses(logged) == {}
    why = "not attached: the tensor passed to backward() is float32 of shape (3,), not a 0-dim floating-point loss"
    assert facts(logged)["probe.loss"]["value"] == why
    # The snapshot says so: no train_loss series, and the probe's reason among its facts.
    engine = Engine()
    for record in read_log(run.run_dir):
        engine.feed(record)
    snapshot = engine.snapshot()
    assert "train_loss" not in snapshot.series
    assert snapshot.facts["probe.loss"].value == why


@heavy
def test_several_backward_roots_in_one_iteration_give_no_loss(run, torch):
    # One forward of the model, two backward calls (two heads' losses): their sum is no loss the loop computed.
    code = (
        "import torch\ntorch.set_num_threads(1)\n"
        "model = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n    out = model(torch.ones(5, 4))\n"
        "    out[:, 0].sum().backward(retain_graph=True)\n    out[:, 1].sum().backward()\n    opt.step()\n"
    )
    run.python(["-c", code], run.env())
    logged = run.records()
    assert backward_losses(logged) == {}
    assert facts(logged)["probe.loss"]["value"] == (
        "not attached: 2 backward() calls for 1 micro-batches: several backward roots in one iteration"
    )


@heavy
def test_backward_on_a_list_of_tensors_is_several_roots(run, torch):
    code = (
        "import torch\ntorch.set_num_threads(1)\n"
        "w = torch.nn.Parameter(torch.ones(3))\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(2):\n"
        "    opt.zero_grad()\n    torch.autograd.backward([w.sum(), (w * w).sum()])\n    opt.step()\n"
    )
    run.python(["-c", code], run.env())
    logged = run.records()
    assert backward_losses(logged) == {}
    assert facts(logged)["probe.loss"]["value"] == (
        "not attached: backward() was called on 2 tensors at once: several backward roots"
    )


@heavy
def test_a_reentrant_checkpoints_own_backward_calls_are_not_the_loops(run, torch):
    # torch.utils.checkpoint(use_reentrant=True) calls torch.autograd.backward on the block's outputs (not 0-dim)
    # inside the loop's backward: only the outermost call is the loop's.
    code = (
        "import json, torch\nfrom torch.utils.checkpoint import checkpoint\ntorch.set_num_threads(1)\n"
        "torch.manual_seed(0)\nblock = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())\n"
        "opt = torch.optim.SGD(block.parameters(), lr=0.1)\nlosses = []\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n    x = torch.ones(2, 4, requires_grad=True)\n"
        "    loss = checkpoint(block, x, use_reentrant=True).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()\n    losses.append(loss.item())\n"
        "print(json.dumps(losses))\n"
    )
    done = run.python(["-c", code], run.env())
    printed = json.loads(done.stdout)
    losses = backward_losses(run.records())
    assert [losses[step] for step in (1, 2, 3)] == printed


# A loop with no tracker and no emit(): its only loss is the one it passes to backward(), NaN from NAN_FROM on.
ONLY_BACKWARD = """
import math, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
steps, nan_from = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
inputs, targets = torch.randn(8, 4), torch.randn(8, 1)
for step in range(1, steps + 1):
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    if step >= nan_from:
        loss = loss * math.nan
    loss.backward()
    optimizer.step()
    time.sleep(0.02)  # about 50 steps a second: some 20 steps between two ticks
"""


def run_only_backward(tmp_path, tm_env, steps: int, nan_from: int):
    """The loop above under tm (no web page); returns its run directory and its log as JSON."""
    from tm_runs import log_records, only_run, run_tm

    script = tmp_path / "loop.py"
    script.write_text(ONLY_BACKWARD)
    env = dict(tm_env, TM_DISABLE_COMPONENTS="web")
    done = run_tm([str(script), str(steps), str(nan_from)], env, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = only_run(tmp_path / "runs")
    return run_dir, log_records(run_dir)


@heavy
def test_a_run_whose_only_loss_is_read_at_backward_keeps_every_loss_beside_its_step_times(
    torch, tm_env, tmp_path
):
    from trainmeter_web.follow import replayed_dashboard

    run_dir, logged = run_only_backward(tmp_path, tm_env, steps=200, nan_from=10**9)
    assert sorted(backward_losses(logged)) == list(range(1, 201))
    # What the dashboard, the report and tm compare read: the engine's history, as /api/series and /api/history give it.
    dashboard = replayed_dashboard(run_dir)
    catalog = dashboard.catalog()
    assert catalog["train_loss"]["points"] == 200
    assert catalog["tm:rank:0:step_time_s"]["points"] == 199  # 200 steps, 199 intervals
    # Thinned to 40 points, both merge ceil(200 / 40) = ceil(199 / 40) = 5 neighbours a point and keep every count.
    losses = dashboard.history("train_loss", "step", max_points=40)
    times = dashboard.history("tm:rank:0:step_time_s", "step", max_points=40)
    assert [p.count for p in losses] == [5] * 40 and sum(p.count for p in times) == 199
    assert [p.x for p in losses] == [float(step) for step in range(5, 201, 5)]


@heavy
def test_a_loss_read_at_backward_that_turns_nan_at_step_101_counts_50_and_the_alert_names_step_101(
    torch, tm_env, tmp_path
):
    run_dir, logged = run_only_backward(tmp_path, tm_env, steps=150, nan_from=101)
    losses = backward_losses(logged)
    # JSON has no NaN: the log writes it as the string "NaN" (docs/bus.md).
    assert [step for step, value in losses.items() if value == "NaN"] == list(range(101, 151))
    summary = json.loads((run_dir / "summary.json").read_text())["snapshot"]
    assert summary["metrics"]["loss_nonfinite"]["value"] == 50.0
    fired = [r for r in logged if r["kind"] == "alert" and r["rule"] == "loss_nan" and r["state"] == "fired"]
    assert len(fired) == 1, fired
    assert fired[0]["numbers"]["step"] == 101.0
    assert re.search(r"at step 101\b", fired[0]["message"]), fired[0]["message"]


class LandingRing:
    """Stands in for the pinned host slots and CUDA events of a GPU (none here): a copy lands when the test says so.

    It answers as ``_PinnedRing`` does: ``landed`` never waits, ``read`` gives the value and frees the slot.
    """

    def __init__(self) -> None:
        self.values: dict[int, float] = {}
        self.landed_slots: set[int] = set()

    def put(self, value: float) -> int:
        slot = len(self.values) + len(self.landed_slots) + 100
        self.values[slot] = value
        return slot

    def landed(self, slot: int) -> bool:
        return slot in self.landed_slots

    def read(self, slot: int) -> float:
        self.landed_slots.discard(slot)
        return self.values.pop(slot)


def test_a_gpu_loss_is_sent_in_step_order_once_every_copy_of_its_iteration_has_landed(run):
    from trainmeter_agent._agent import Agent
    from trainmeter_agent._loss import LossProbe

    agent = Agent(run.endpoint)
    probe = LossProbe(agent)
    ring = LandingRing()
    sent: list[tuple] = []  # what the probe hands the agent, in order (the agent then sends it on the bus)
    tapped = agent.tapped

    def watch(origin: str, values: dict, step: int) -> None:
        sent.append((step, values, origin))
        tapped(origin, values, step)

    agent.tapped = watch

    def iteration(step: int, *values: float) -> list[int]:
        slots = [ring.put(v) for v in values]
        # What the probe's own reading leaves after each backward of a CUDA loss: a copy in flight per call.
        probe._calls, probe._entries, probe._copies = len(values), [(ring, slot) for slot in slots], True
        probe.end_iteration({"step": step, "micro_batches": len(values)})
        return slots

    first = iteration(1, 1.5, 0.25)
    assert sent == []  # in flight: nothing read, nothing waited for
    second = iteration(2, 0.75, 0.5)
    ring.landed_slots.update(second)
    probe.poll()
    assert sent == []  # step 2 landed first, but step 1 goes out first
    ring.landed_slots.update(first[:1])
    probe.poll()
    assert sent == []  # half of step 1 is not a loss
    ring.landed_slots.update(first[1:])
    probe.poll()
    # Step 1: 1.5 + 0.25 = 1.75; step 2: 0.75 + 0.5 = 1.25; every slot given back.
    assert sent == [
        (1, {"train_loss": 1.75}, "backward"),
        (2, {"train_loss": 1.25}, "backward"),
    ]
    assert ring.values == {} and not probe._pending
    agent.flush()
    agent.at_exit()
    wait_for(lambda: run.hub.kinds.get("bye", 0) >= 1, what="the agent's bye")
    assert backward_losses(run.records()) == {1: 1.75, 2: 1.25}


# --------------------------------------------------------------------------------------------------------------------
# The engine: emit() > a tapped tracker > the loss from backward()


def metric(values: dict[str, float], origin: str, step: int, t: float) -> records.Metric:
    return records.Metric(values=values, origin=origin, step=step, t=t)


def next_iteration(engine: Engine, step: int, t: float) -> None:
    engine.feed(records.Step(step=step, t=t))


def test_the_loss_from_backward_is_train_loss_until_a_tracker_reports_it():
    engine = Engine()
    engine.feed(metric({"train_loss": 2.5}, "backward", 1, 1.0))
    next_iteration(engine, 2, 1.1)  # the iteration is over: its loss from backward() stands
    assert engine.snapshot().series["train_loss"].value == 2.5
    engine.feed(metric({"train/loss": 2.25}, "wandb", 2, 2.0))
    engine.feed(metric({"train_loss": 2.0}, "backward", 3, 3.0))  # the tracker's series now: dropped
    point = engine.snapshot().series["train_loss"]
    assert (point.value, point.raw_key, point.step) == (2.25, "train/loss", 2)


def test_emit_beats_the_loss_from_backward():
    engine = Engine()
    engine.feed(metric({"train_loss": 2.5}, "emit", 1, 1.0))
    engine.feed(metric({"train_loss": 9.0}, "backward", 2, 2.0))
    assert engine.snapshot().series["train_loss"].value == 2.5


def test_the_loops_own_loss_of_an_iteration_replaces_the_one_read_at_backward():
    # A loop calls backward(), then optimizer.step(), then emit(train_loss=...): the agent's reading of the first
    # iteration is held until the iteration is over, so the chart gets the loop's value once, not both.
    engine = Engine()
    engine.feed(metric({"train_loss": 2.5}, "backward", 1, 1.0))
    engine.feed(records.Step(step=1, t=1.1))
    engine.feed(metric({"train_loss": 2.5}, "emit", 1, 1.2))
    engine.feed(metric({"train_loss": 2.25}, "backward", 2, 2.0))  # emit's series now: dropped at once
    engine.feed(records.Step(step=2, t=2.1))
    engine.feed(metric({"train_loss": 2.25}, "emit", 2, 2.2))
    engine.feed(records.Step(step=3, t=3.1))
    points = engine.history.query("train_loss", "step")
    assert [(p.x, p.value) for p in points] == [(1.0, 2.5), (2.0, 2.25)]


def test_a_loss_only_read_at_backward_goes_in_at_the_next_step_tick_or_end():
    engine = Engine()
    engine.feed(metric({"train_loss": 3.0}, "backward", 1, 1.0))
    assert "train_loss" not in engine.snapshot().series  # held while its iteration may still report its own
    engine.feed(records.Tick(n=1, interval_s=1.0, t=1.5))
    assert engine.snapshot().series["train_loss"].value == 3.0
    engine.feed(metric({"train_loss": 2.0}, "backward", 2, 2.0))
    (final,) = engine.feed(records.RunEnd(status=0, reason="exited", elapsed_s=2.5, t=2.5))
    assert final.series["train_loss"].value == 2.0
    assert [p.value for p in engine.history.query("train_loss", "step")] == [3.0, 2.0]


def test_the_loss_from_backward_leaves_a_bare_loss_the_loops_train_loss():
    # HF Trainer logs a bare "loss": it is train_loss while no explicit train key came from the loop itself.
    engine = Engine()
    engine.feed(metric({"train_loss": 2.5}, "backward", 1, 1.0))
    engine.feed(metric({"loss": 1.75}, "hf", 1, 1.5))
    engine.feed(metric({"train_loss": 2.0}, "backward", 2, 2.0))
    next_iteration(engine, 3, 2.1)
    snapshot = engine.snapshot()
    assert snapshot.series["train_loss"].value == 1.75 and snapshot.series["train_loss"].raw_key == "loss"
    assert "loss" not in snapshot.series
