"""The agent's C hooks (trainmeter_agent/_native.c, issue 16): each transliterates a Python function of the agent, so
a loop gives the same records through them as through their Python twins (TM_AGENT_NATIVE=0), in every way it can
take them; they are used where built and said where not; and dynamo never meets one it cannot trace.

CI builds them (./scripts/setup installs tm, whose build hook compiles them) and sets TM_REQUIRE_NATIVE=1: there a
missing build fails these tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_agent import SCRIPTS, heavy, kinds
from test_agent_depth import GPT

REPO = Path(__file__).resolve().parent.parent
PYTHON_HOOKS = {"TM_AGENT_NATIVE": "0"}
# What differs between two runs of one deterministic loop: the clocks, the process and its counters.
RUN_DEPENDENT = {
    "t",
    "wall",
    "step_time_s",
    "agent_us",
    "start_t",
    "end_t",
    "pid",
    "seq",
    "dropped",
    "loss_t",
}
C_HOOKS = {"next": "DataNext", "backward": "Backward", "forward": "Forward", "step": ["StepPreHook"]}
PYTHON_ONES = {"next": "function", "backward": "function", "forward": "ModelForward", "step": ["method"]}


@pytest.fixture(scope="module")
def native():
    """The C module as the agent loads it, or a failure (TM_REQUIRE_NATIVE=1) or a skip that says why not."""
    from trainmeter_agent import _nativelane

    module, why = _nativelane.load()
    if module is None:
        if os.environ.get("TM_REQUIRE_NATIVE") == "1":
            pytest.fail(f"the agent's C hooks are required here (TM_REQUIRE_NATIVE=1) but not used: {why}")
        pytest.skip(why)
    return module


def loop_records(records: list[dict], pid: int) -> list[dict]:
    kept = [r for r in records if r["pid"] == pid and r["kind"] in ("step", "metric", "phase", "notice")]
    return [{k: v for k, v in r.items() if k not in RUN_DEPENDENT} for r in kept]


def both_ways(run, args: list[str]) -> tuple[list[dict], list[dict], list[str]]:
    """The loop run once with the C hooks and once with the Python ones: each one's loop records, and their stdout."""
    first = run.python(args, run.env(), byes=1)
    second = run.python(args, run.env(**PYTHON_HOOKS), byes=2)
    records = run.records()
    pids = list(dict.fromkeys(r["pid"] for r in records))
    assert len(pids) == 2
    facts = {
        pid: {r["name"]: r.get("value") for r in kinds(records, "fact") if r["pid"] == pid} for pid in pids
    }
    assert facts[pids[0]]["probe.native"] == "attached"
    assert (
        facts[pids[1]]["probe.native"] == "not attached: TM_AGENT_NATIVE=0: the agent runs its Python hooks"
    )
    return loop_records(records, pids[0]), loop_records(records, pids[1]), [first.stdout, second.stdout]


@heavy
@pytest.mark.parametrize(
    "args",
    [
        # micro-batches, eval passes, the data wait, the counted FLOP step, the loss summed over micro-batches
        [str(GPT), "--steps", "12", "--accum", "2", "--eval-every", "4", "--dataloader"],
        # GradScaler: the scaled loss (backward's general way) and skipped steps
        [str(GPT), "--steps", "8", "--scaler", "65536", "--dataloader"],
        [
            str(SCRIPTS / "train_loop.py"),
            "two_optimizers",
            "12",
        ],  # no steady lane: the optimizer hooks' general way
        [
            str(SCRIPTS / "train_loop.py"),
            "double_step",
            "12",
        ],  # a second step without a backward, in the lane
        [str(SCRIPTS / "train_loop.py"), "all", "24"],  # GradScaler's skipped steps and emit beside the hooks
    ],
    ids=["gpt-accum-eval-dataloader", "gpt-grad-scaler", "two-optimizers", "double-step", "scaler-and-emit"],
)
def test_a_loop_sends_the_same_records_through_the_c_hooks_as_through_their_python_twins(
    run, torch, native, args
):
    through_c, through_python, outputs = both_ways(run, args)
    assert [r["kind"] for r in through_c] == [r["kind"] for r in through_python]
    assert through_c == through_python
    assert outputs[0] == outputs[1]  # the loop itself saw the same losses
    assert [r["step"] for r in through_c if r["kind"] == "step"][-1] >= 8


@heavy
def test_every_way_through_the_hooks_gives_the_same_records_and_reaches_the_loop_the_same(run, torch, native):
    through_c, through_python, outputs = both_ways(run, [str(SCRIPTS / "native_edges.py")])
    assert through_c == through_python
    seen_c, seen_python = json.loads(outputs[0]), json.loads(outputs[1])
    assert seen_c.pop("hooks_while_training") == C_HOOKS
    assert seen_python.pop("hooks_while_training") == PYTHON_ONES
    assert seen_c == seen_python
    # The loop's own errors reached it as they are, through the C hooks too.
    assert [c[:2] for c in seen_c["caught"]] == [
        ["forward", "IndexError"],
        ["backward", "RuntimeError"],
        ["next", "StopIteration"],
        ["step", "TypeError"],
    ]
    assert seen_c["forward_reads"] == {"self": True, "func": True, "signature": True}
    assert seen_c["copies"] == {"deepcopy": False, "pickle": False, "torch.save": False, "replica": False}
    assert seen_c["copies_work"] is True
    # The step with no gradient, the vector and the two roots were seen for what they are, both ways.
    losses = [r for r in through_c if r["kind"] == "metric"]
    assert len(losses) < len([r for r in through_c if r["kind"] == "step"])


@heavy
@pytest.mark.parametrize("hooks", ["c", "python"])
@pytest.mark.parametrize("mode", ["compile", "function", "export", "export-strict"])
def test_dynamo_traces_the_python_twins_and_the_loop_goes_on(run, torch, native, mode, hooks):
    """torch.compile makes every hook Python again; torch.export (strict or not) traces the model's forward through
    ModelForward.__call__ while the C hooks stay; a compiled function calling the model works as without tm. With
    the Python hooks from the start, the same (the model's forward reads as a bound method: torch.export's
    non-strict tracing reads its __code__, and dynamo's guard on a forward set on a module reads its __dict__)."""
    env = run.env() if hooks == "c" else run.env(**PYTHON_HOOKS)
    done = run.python([str(SCRIPTS / "native_dynamo.py"), mode], env, byes=1)
    seen = json.loads(done.stdout)
    assert seen["before"] == (C_HOOKS if hooks == "c" else PYTHON_ONES)
    if mode.startswith("export"):
        assert seen["exported"] is True
        assert seen["after"] == seen["before"]  # no compilation started: the C hooks stay
    else:
        assert seen["after"]["next"] == "function" and seen["after"]["backward"] == "function"
        assert seen["after"]["step"] == ["method"]
    records = run.records()
    assert [s["step"] for s in kinds(records, "step")] == list(range(1, 9))
    states = [r["value"] for r in kinds(records, "fact") if r["name"] == "probe.native"]
    if hooks == "python":
        assert states == ["not attached: TM_AGENT_NATIVE=0: the agent runs its Python hooks"]
    elif mode.startswith("export"):
        assert states == ["attached"]
    else:
        assert states == [
            "attached",
            "not attached: torch.compile was called: the agent runs its Python hooks, which dynamo can trace",
        ]


def test_the_c_forward_reads_as_the_bound_method_and_dynamo_reads_the_python_call(torch, native):
    """Without an agent: the C forward on a model is the model's forward for whoever reads it."""
    import inspect
    import pickle

    from trainmeter_agent._forward import ModelForward

    model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))

    class Off:  # a model probe that is off: the C forward calls through
        on = False

    forward = native.Forward(Off(), model, torch.nn.Sequential.forward, object())
    assert type(forward).__call__ is ModelForward.__call__  # what dynamo inlines in its place
    assert forward.__self__ is model and forward.__func__ is torch.nn.Sequential.forward
    assert (
        forward.__code__ is torch.nn.Sequential.forward.__code__
    )  # torch.export's non-strict tracing reads it
    assert inspect.signature(forward) == inspect.signature(torch.nn.Sequential.forward.__get__(model))
    ids = torch.randint(16, (2, 8))
    assert torch.equal(forward(ids), torch.nn.Sequential.forward(model, ids))
    assert pickle.loads(pickle.dumps(forward)) is not None  # the loaded one is the model's own forward
    with pytest.raises(AttributeError):
        getattr(forward, "no_such_attribute")  # noqa: B009 - the lookup is the point


def test_a_build_from_another_source_is_not_used_and_says_why(tmp_path, native):
    """A checkout whose _native.c changed since tm was installed runs the Python hooks, and says so."""
    package = tmp_path / "trainmeter_agent"
    shutil.copytree(REPO / "trainmeter_agent", package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(package / "_native.c", "a") as source:
        source.write("/* changed */\n")
    code = "from trainmeter_agent import _nativelane; print(_nativelane.load()[1])"
    # -S and another folder: neither the editable install of tm nor the current folder finds this checkout first.
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "was built from another _native.c than the one beside it" in done.stdout
    assert str(package) in done.stdout


def test_the_build_says_why_it_leaves_the_c_hooks_out(tmp_path, monkeypatch):
    """No compiler, a failing one, or TM_BUILD_NATIVE=0: the build goes on without them and says why."""
    sys.path.insert(0, str(REPO))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(REPO))
    source, target = str(REPO / hatch_build.SOURCE), str(tmp_path / "_native.so")
    monkeypatch.setenv("TM_BUILD_NATIVE", "0")
    assert hatch_build.compile_native(source, target) == "TM_BUILD_NATIVE=0"
    monkeypatch.delenv("TM_BUILD_NATIVE")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    why = hatch_build.compile_native(source, target)
    assert why is not None and "no-such-compiler" in why and "did not run" in why
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setenv("CC", "cc")
    why = hatch_build.compile_native(str(broken), target)
    assert why is not None and "failed (exit" in why and "error" in why
    assert not os.path.exists(target)
