"""The in-process agent: bootstrap, step records, emit, dormancy, and that nothing it does reaches the loop.

End-to-end tests run small scripts (tests/agent_scripts/) as real subprocesses under the launcher's environment,
against a real Hub and Recorder in this process, and read the run log they leave.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from deadline import wait_for
from tm_runs import expand_blocks

from trainmeter_agent._agent import PROBES
from trainmeter_core.bus.hub import Hub
from trainmeter_core.model import records
from trainmeter_core.runlog.recorder import Recorder

REPO = Path(__file__).resolve().parents[2]
BOOT = REPO / "trainmeter_agent" / "boot"
SCRIPTS = REPO / "tests" / "agent_scripts"
heavy = pytest.mark.xdist_group("heavy")


def plain_env(**extra: str) -> dict[str, str]:
    """The environment of a run without tm: no TM_* variable, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


class Run:
    """A hub and a recorder as the launcher starts them, and the training processes run under them."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-")  # ipc paths are limited to 107 bytes
        self.endpoint = f"ipc://{self.socket_dir}/in"
        self.recorder = Recorder(run_dir, reserve_b=0)
        self.recorder.start()
        self.hub = Hub(self.endpoint, f"ipc://{self.socket_dir}/out", self.recorder)
        self.hub.start()
        self._records: list[dict] | None = None

    def env(self, pythonpath: list[str] | None = None, **extra: str) -> dict[str, str]:
        path = [str(BOOT), str(REPO), *(pythonpath or [])]
        env = plain_env(PYTHONPATH=os.pathsep.join(path))
        env.update(
            TM_ACTIVE="1",
            TM_AGENT="1",
            TM_AGENT_ENDPOINT=self.endpoint,
            TM_RUN_DIR=str(self.run_dir),
            TM_LAUNCHER_PID=str(os.getpid()),
        )
        env.update(extra)
        return env

    def python(self, args: list[str], env: dict[str, str], byes: int = 1) -> subprocess.CompletedProcess:
        """Run a Python command to its end, then wait (deadline poll) until ``byes`` producers said goodbye."""
        done = subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, cwd=self.run_dir
        )
        assert done.returncode == 0, done.stderr
        wait_for(lambda: self.hub.kinds.get("bye", 0) >= byes, what=f"{byes} bye records")
        return done

    def records(self) -> list[dict]:
        """The agents' records in the run log, in hub order (the hub's own tick and bus.stats left out)."""
        if self._records is None:
            self.hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=1.0))
            self.recorder.close()
            lines = (self.run_dir / "events-0001.jsonl").read_text().splitlines()
            logged = expand_blocks(list(map(json.loads, lines)))
            self._records = [r for r in logged if r.get("source") == "agent"]
        return self._records

    def close(self) -> None:
        if self._records is None:
            self.records()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def kinds(logged: list[dict], kind: str) -> list[dict]:
    return [r for r in logged if r["kind"] == kind]


def tm_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tm:")]


def train(run: Run, mode: str, **env: str) -> list[str]:
    done = run.python([str(SCRIPTS / "train_loop.py"), mode], run.env(**env))
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------------------------------------
# Step records from real loops


@heavy
def test_fifty_iterations_give_fifty_steps_numbered_one_to_fifty(run, torch):
    train(run, "plain")
    steps = kinds(run.records(), "step")
    assert [s["step"] for s in steps] == list(range(1, 51))
    assert not any(s.get("skipped") for s in steps)
    # The first step has no previous one to time; every later one has a positive step time and one optimizer call.
    assert steps[0]["absent"]["step_time_s"] == "first step" and "step_time_s" not in steps[0]
    assert all(s["step_time_s"] > 0 and s["optimizers"] == 1 for s in steps[1:])


@heavy
def test_two_optimizers_stepping_each_iteration_count_once(run, torch):
    train(run, "two_optimizers")
    steps = kinds(run.records(), "step")
    assert [s["step"] for s in steps] == list(range(1, 51))
    assert {s["optimizers"] for s in steps[1:]} == {2}  # SGD on the weight + AdamW on the bias


@heavy
def test_grad_scaler_skipped_steps_still_count_and_are_marked(run, torch):
    train(run, "grad_scaler")
    steps = kinds(run.records(), "step")
    assert [s["step"] for s in steps] == list(range(1, 51))
    # An inf goes into a gradient on iterations 10, 20, 30, 40 and 50: five skipped steps.
    assert [s["step"] for s in steps if s.get("skipped")] == [10, 20, 30, 40, 50]


@heavy
def test_a_second_step_without_backward_is_the_same_iteration(run, torch):
    train(run, "double_step")
    steps = kinds(run.records(), "step")
    assert [s["step"] for s in steps] == list(range(1, 51))
    assert {s["optimizers"] for s in steps[1:]} == {2}  # both calls seen, one iteration


# --------------------------------------------------------------------------------------------------------------------
# hello, emit


def test_hello_comes_first_with_the_protocol_version(run):
    run.python(["-c", "from trainmeter_agent import emit; emit(loss=1.0)"], run.env())
    logged = run.records()
    assert [r["kind"] for r in logged] == ["hello", "metric", "bye"]
    # records.Hello omits fields equal to their default, and protocol's default is this version: the typed record
    # carries it back (a line without "protocol" means the reader's own PROTOCOL_VERSION).
    hello = records.from_mapping(logged[0])
    assert isinstance(hello, records.Hello)
    assert hello.protocol == records.PROTOCOL_VERSION and hello.role == "trainer" and hello.agent_version
    assert logged[1]["values"] == {"loss": 1.0}
    assert logged[2]["sent"] == 2  # hello and metric


def test_a_process_that_never_reports_stays_silent_and_imports_nothing_heavy(run):
    # Saying hello at exit would cost every short Python process of a run ~80 ms (zmq, msgspec, a delivery wait).
    code = "import sys; print(sorted(m for m in ('torch', 'zmq', 'msgspec') if m in sys.modules))"
    done = run.python(["-c", code], run.env(), byes=0)
    assert done.stdout.strip() == "[]"
    assert [r["kind"] for r in run.records()] == []


def test_emit_outside_tm_is_a_no_op_that_loads_nothing(tmp_path):
    code = (
        "import json, sys, time\n"
        "from trainmeter_agent import emit\n"
        "start = time.perf_counter()\n"
        "results = [emit(loss=1.0) for _ in range(100000)]\n"
        "per_call_us = (time.perf_counter() - start) * 10\n"
        "heavy = [m for m in ('zmq', 'msgspec', 'torch', 'trainmeter_core', 'trainmeter_agent._agent') if m in sys.modules]\n"
        "print(json.dumps({'results': sorted(set(map(str, results))), 'heavy': heavy, 'per_call_us': per_call_us}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=plain_env(), capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["results"] == ["None"]
    assert seen["heavy"] == []  # nothing but the package itself was imported
    assert done.stderr == ""
    print(f"emit outside tm: {seen['per_call_us']:.3f} µs per call")


def test_emit_takes_numbers_and_cpu_tensors_and_refuses_other_devices_once(run, torch):
    done = run.python([str(SCRIPTS / "emit_values.py")], run.env())
    metrics = kinds(run.records(), "metric")
    # 2.5 from a 0-dim CPU tensor, 3 -> 3.0, True -> 1.0; the meta and 2-value tensors are skipped, 0.25 kept.
    assert [m["values"] for m in metrics] == [{"loss": 2.5, "n": 3.0, "flag": 1.0}, {"kept": 0.25}]
    lines = tm_lines(done.stderr)
    assert len(lines) == 3, lines  # accelerator (once), vector, label
    assert "accelerator=value.item()" in lines[0] and "meta" in lines[0]


def test_a_complex_value_is_refused_alone_and_emit_stays_on(run, torch):
    done = run.python([str(SCRIPTS / "emit_complex.py")], run.env())
    metrics = kinds(run.records(), "metric")
    assert [m["values"] for m in metrics] == [{"y": 1.0}, {"y": 2.0}, {"y": 3.0}]
    lines = tm_lines(done.stderr)
    assert len(lines) == 1, lines
    assert "emit(x=...)" in lines[0] and "complex" in lines[0] and "real number" in lines[0]
    assert "stopped" not in done.stderr


def test_emitted_steps_drive_a_loop_without_torch_optim(run):
    run.python([str(SCRIPTS / "emit_steps.py")], run.env())
    logged = run.records()
    steps = kinds(logged, "step")
    assert [(s["step"], s["tokens"], s["tokens_source"]) for s in steps] == [
        (n, 4096, "emitted") for n in range(1, 6)
    ]
    metrics = kinds(logged, "metric")
    assert [(m["step"], sorted(m["values"])) for m in metrics] == [
        (n, k) for n in range(1, 6) for k in (["loss"], ["lr"])
    ]


# --------------------------------------------------------------------------------------------------------------------
# Where the agent stays out


def test_an_existing_sitecustomize_still_runs_under_tm(run, tmp_path):
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\nMARK = 'other'\n"
    )
    code = (
        "import os, sitecustomize\n"
        "from trainmeter_agent import emit\n"
        "emit(x=1.0)\n"
        "print(os.environ.get('OTHER_SITECUSTOMIZE'), sitecustomize.MARK)"
    )
    done = run.python(["-c", code], run.env(pythonpath=[str(other)]))
    assert done.stdout.split() == ["ran", "other"]
    assert [r["kind"] for r in run.records()] == ["hello", "metric", "bye"]  # and the agent is there too


def test_an_existing_sitecustomize_still_runs_with_no_agent(tmp_path):
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("MARK = 'other'\n")
    env = plain_env(PYTHONPATH=os.pathsep.join([str(BOOT), str(REPO), str(other)]), TM_AGENT="0")
    code = "import sys, sitecustomize; print(sitecustomize.MARK, 'trainmeter_agent' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["other", "False"]


def test_a_failing_sitecustomize_fails_as_it_would_without_tm(tmp_path):
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    code = "print('ran')"
    outputs = []
    for path in ([str(other)], [str(BOOT), str(REPO), str(other)]):
        env = plain_env(PYTHONPATH=os.pathsep.join(path))
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.append((done.stdout, done.stderr))
    assert outputs[0] == (
        "ran\n",
        "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: broken site\n",
    )
    assert outputs[1] == outputs[0]


def test_a_multiprocessing_spawn_child_stays_dormant(run):
    done = run.python([str(SCRIPTS / "spawn_child.py")], run.env())
    seen = json.loads(done.stdout)
    assert seen["child"]["agent_modules"] == []
    hellos = kinds(run.records(), "hello")
    assert [h["pid"] for h in hellos] == [seen["parent"]]  # neither the child nor the resource tracker


@heavy
def test_fork_children_send_nothing_unless_they_emit(run, torch):
    done = run.python([str(SCRIPTS / "fork_children.py")], run.env(), byes=2)
    pids = json.loads(done.stdout)
    logged = run.records()
    assert not [r for r in logged if r["pid"] == pids["quiet"]]
    child = [r for r in logged if r["pid"] == pids["talking"]]
    assert [r["kind"] for r in child] == ["hello", "metric", "bye"]
    assert "step" not in child[1]  # the child's iteration count starts from zero
    parent_metric = [
        r for r in kinds(logged, "metric") if r["pid"] == pids["parent"] and r.get("origin", "emit") == "emit"
    ]
    assert parent_metric[0]["step"] == 3


BOOT_SPEC = importlib.util.spec_from_file_location("tm_boot_sitecustomize", BOOT / "sitecustomize.py")
boot = importlib.util.module_from_spec(BOOT_SPEC)
BOOT_SPEC.loader.exec_module(boot)  # under another name, it defines its functions and runs nothing


@pytest.mark.parametrize(
    "argv",
    [
        [
            "python",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4)",
            "--multiprocessing-fork",
        ],
        ["python", "-B", "-c", "from multiprocessing.forkserver import main; main(3, 4, [])"],
        ["python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"],
        [
            "python",
            "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/__main__.py",
            "--workers=4",
        ],
        ["python", "-m", "torch._inductor.compile_worker", "--workers=4"],
        ["python", "/venv/bin/torchrun", "--standalone", "--nproc_per_node=2", "train.py"],
        ["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"],
        ["python", "-X", "utf8", "-mtorch.distributed.run", "train.py"],
    ],
)
def test_helper_processes_are_dormant(argv):
    assert boot.dormant_reason(argv) is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py", "--multiprocessing"],
        ["python", "-u", "-W", "ignore", "train.py"],
        ["python", "-m", "torch_trainer"],
        ["python", "-c", "import torch; print(1)"],
        ["python", "-X", "importtime", "torchrun_notes.py"],
    ],
)
def test_training_commands_are_not_dormant(argv):
    assert boot.dormant_reason(argv) is None


# --------------------------------------------------------------------------------------------------------------------
# Invariant 1: nothing reaches the loop


@pytest.fixture(scope="module")
def plain_losses():
    """The `all` loop's losses without tm: the control for every faulted run."""
    script = str(SCRIPTS / "train_loop.py")
    done = subprocess.run([sys.executable, script, "all"], env=plain_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@heavy
@pytest.mark.parametrize("probe", PROBES)
def test_an_internal_error_in_a_probe_says_one_line_and_changes_no_loss(run, torch, plain_losses, probe):
    done = run.python([str(SCRIPTS / "train_loop.py"), "all"], run.env(TM_AGENT_FAULT=probe), byes=0)
    assert json.loads(done.stdout) == plain_losses  # bit for bit, as float.hex
    lines = tm_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"tm: agent {probe} stopped: InjectedFault"), done.stderr


@heavy
def test_a_stopped_step_probe_tells_the_run_and_the_rest_goes_on(run, torch):
    train(run, "all", TM_AGENT_FAULT="steps")
    logged = run.records()
    assert not kinds(logged, "step")
    notices = kinds(logged, "notice")
    assert [n["topic"] for n in notices] == ["agent.steps"]
    assert len(kinds(logged, "metric")) >= 1 and logged[-1]["kind"] == "bye"


@heavy
def test_the_users_own_exceptions_pass_through_unchanged(run, torch):
    done = run.python([str(SCRIPTS / "user_error.py")], run.env())
    seen = json.loads(done.stdout)
    for case, expected in [
        ("plain", "ValueError"),
        ("grad_scaler", "ValueError"),
        ("interrupt", "KeyboardInterrupt"),
        ("interrupt_grad_scaler", "KeyboardInterrupt"),
    ]:
        result = seen["results"][case]
        assert result == {"type": expected, "same": True, "file": seen["script"], "function": "step"}, case
    assert tm_lines(done.stderr) == []


# --------------------------------------------------------------------------------------------------------------------
# Iteration grouping, by calling the detector's hooks around real optimizers


class FakeAgent:
    """Collects the step records the detector hands over."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.stopped: list[str] = []
        self._faults: set[str] = set()
        self.activated = True
        self.lean = True
        self.model = None  # no model probe: the first step asks none which module the model is

    def send_step(self, fields: dict) -> None:
        self.steps.append(fields)

    def send_steady_step(self, *args) -> bool:
        return False  # every step comes through send_step with its fields, where these tests read them

    def regate(self) -> None:
        pass  # no short way of its own to gate

    def stop_probe(self, probe: str, exc: BaseException) -> None:
        self.stopped.append(probe)


HOOK_WAYS = ["general way", "steady lane"]


def detector_called(way: str):
    """The detector, its hooks called with no arguments (the general way) or with the optimizer as torch passes it,
    which lets an optimizer alone in its iteration take the steady lane: both ways must count the same."""
    from trainmeter_agent._iterations import IterationDetector

    detector = IterationDetector(FakeAgent())
    detector.hook_args = (lambda optimizer: (optimizer,)) if way == "steady lane" else (lambda _: ())
    return detector


@pytest.fixture(params=HOOK_WAYS)
def detector(request):
    return detector_called(request.param)


def hooked_step(detector, optimizer) -> None:
    args = detector.hook_args(optimizer)
    detector.pre_hook(optimizer, args, {})
    optimizer.step()
    detector.post_hook(optimizer, args, {})


def test_muon_with_adamw_counts_once_per_iteration(detector, torch):
    model = torch.nn.Linear(3, 3)
    matrices = torch.optim.SGD([model.weight], lr=0.1)
    others = torch.optim.AdamW([model.bias], lr=0.1)
    for _ in range(4):
        matrices.zero_grad(), others.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        hooked_step(detector, matrices)
        hooked_step(detector, others)
    assert [s["step"] for s in detector.agent.steps] == [1, 2, 3, 4]


def test_a_gan_counts_once_per_loop_iteration(detector, torch):
    discriminator, generator = torch.nn.Linear(2, 1), torch.nn.Linear(2, 2)
    d_opt = torch.optim.SGD(discriminator.parameters(), lr=0.1)
    g_opt = torch.optim.SGD(generator.parameters(), lr=0.1)
    for _ in range(3):
        d_opt.zero_grad()
        discriminator(generator(torch.ones(1, 2)).detach()).sum().backward()
        hooked_step(detector, d_opt)
        g_opt.zero_grad()
        discriminator(generator(torch.ones(1, 2))).sum().backward()
        hooked_step(detector, g_opt)
    assert [s["step"] for s in detector.agent.steps] == [1, 2, 3]
    assert [s.get("optimizers") for s in detector.agent.steps] == [None, 2, 2]


def test_a_step_after_zero_grad_without_backward_is_not_an_iteration(detector, torch):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    hooked_step(detector, optimizer)
    optimizer.zero_grad()  # set_to_none: no gradient left to apply
    hooked_step(detector, optimizer)
    assert [s["step"] for s in detector.agent.steps] == [1]


def test_gradient_accumulation_into_existing_grads_is_seen_as_a_backward(detector, torch):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad(set_to_none=False)  # the same grad tensors, bumped in place by backward
        model(torch.ones(1, 2)).sum().backward()
        hooked_step(detector, optimizer)
    assert [s["step"] for s in detector.agent.steps] == [1, 2, 3]


def test_a_skipped_step_starts_the_next_iteration_marked_skipped(detector, torch):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    hooked_step(detector, optimizer)
    model(torch.ones(1, 2)).sum().backward()
    detector.skipped_step(optimizer)  # what GradScaler's wrapper reports when no step hook fired
    assert [(s["step"], s.get("skipped", False)) for s in detector.agent.steps] == [(1, False), (2, True)]


def test_an_optimizer_alone_in_its_iterations_takes_the_steady_lane_and_counts_as_the_general_way(torch):
    from trainmeter_agent._iterations import IterationDetector

    def steps(as_torch_calls: bool) -> tuple[list[dict], list[bool]]:
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        detector = IterationDetector(FakeAgent())
        args = (optimizer,) if as_torch_calls else ()
        in_lane = []
        for i in range(6):
            if i != 3:  # iteration 3 steps twice: the second step has no backward before it
                optimizer.zero_grad()
                model(torch.ones(1, 2)).sum().backward()
            in_lane.append(detector._lane == id(optimizer))
            detector.pre_hook(optimizer, args, {})
            optimizer.step()
            detector.post_hook(optimizer, args, {})
        timed = ("t", "step_time_s", "agent_us")
        return [{k: v for k, v in s.items() if k not in timed} for s in detector.agent.steps], in_lane

    lane_steps, in_lane = steps(as_torch_calls=True)
    general_steps, _ = steps(as_torch_calls=False)
    assert lane_steps == general_steps
    assert [s["step"] for s in lane_steps] == [1, 2, 3, 4, 5]
    assert [s.get("optimizers") for s in lane_steps] == [None, 1, 1, 2, 1]  # step 3's iteration stepped twice
    assert in_lane == [False, True, True, True, True, True]  # from the second iteration on


def _counted_through_torch(torch, optimizer_class, plan: str) -> tuple[list[dict], list[bool]]:
    """The detector attached to torch's own global step hooks, around a loop that follows ``plan``, one letter an
    iteration: ``s`` a backward then a step, ``d`` the same then a second step without a backward, ``c`` a
    ``step(closure)``. Returns its step records (without their times) and, per iteration, whether its post-hook was
    registered with torch when the iteration began."""
    from torch.optim import optimizer as optimizer_module

    from trainmeter_agent._iterations import IterationDetector

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    detector = IterationDetector(FakeAgent())
    post_registered = []

    def closure():
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    detector.attach()
    try:
        for letter in plan:
            post_registered.append(
                any(
                    hook == detector.post_hook
                    for hook in optimizer_module._global_optimizer_post_hooks.values()
                )
            )
            if letter == "c":
                optimizer.step(closure)
                continue
            closure()
            optimizer.step()
            if letter == "d":
                optimizer.step()
    finally:
        detector.detach()
    timed = ("t", "step_time_s", "agent_us")
    return [{k: v for k, v in s.items() if k not in timed} for s in detector.agent.steps], post_registered


def test_the_steady_lane_drops_the_post_hook_once_steps_leave_the_gradient_alone_and_counts_the_same(torch):
    plan = "sssssdscsssd"
    logged, post_registered = _counted_through_torch(torch, torch.optim.SGD, plan)
    # Iterations 1-3 are the lane's first three steps that leave the gradient as they found it (iteration 0 counts
    # the first step the general way): from iteration 4 on, no post-hook until the step(closure) takes it back.
    assert post_registered == [True] * 4 + [False] * 4 + [True] * 4
    assert [r["step"] for r in logged] == list(range(1, len(plan) + 1))
    # Each record says how many steps the iteration before it took: a second step without a backward (iteration 5,
    # without the post-hook) joins its iteration.
    assert [r.get("optimizers") for r in logged] == [None, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1]


def test_an_optimizer_that_touches_its_gradients_keeps_the_post_hook(torch):
    class Rescaling(torch.optim.Optimizer):
        """Plain SGD that first rescales the gradients in place (as some optimizers clip them): their versions move
        inside the step. Its own step, not SGD's: a ``super().step()`` would run the step hooks a second time."""

        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            loss = closure() if closure is not None else None
            for group in self.param_groups:
                for param in group["params"]:
                    param.grad.mul_(1.0)
                    param.add_(param.grad, alpha=-group["lr"])
            return loss

    logged, post_registered = _counted_through_torch(torch, Rescaling, "sssssdss")
    assert all(post_registered)
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [r.get("optimizers") for r in logged] == [None, 1, 1, 1, 1, 1, 2, 1]


def test_the_launcher_is_gone_once_its_pid_has_exited(monkeypatch):
    from trainmeter_agent import _launcher_env

    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    monkeypatch.setenv("TM_LAUNCHER_PID", finished.stdout.strip())
    assert _launcher_env.launcher_alive() is False
    monkeypatch.setenv("TM_LAUNCHER_PID", str(os.getpid()))
    assert _launcher_env.launcher_alive() is True


# --------------------------------------------------------------------------------------------------------------------
# The agent's bookkeeping, with a producer that only collects


class CollectingProducer:
    """Stands in for the producer: keeps what would reach the hub, a block as the records it stands for (as a reader
    gets them: ``trainmeter_core.model.records.block.expand``)."""

    def __init__(self) -> None:
        self.records: list = []
        self.batches = 0
        self.closed_with: tuple | None = None

    def send(self, record) -> bool:
        self.records.append(record)
        return True

    def send_many(self, logged) -> bool:
        from trainmeter_core.model.records import block

        for record in logged:
            if type(record) is records.Block:
                block.validate(record)
                self.records.extend(block.expand(record))
            else:
                self.records.append(record)
        self.batches += 1
        return True

    def stamp(self, record, now_t: float, now_wall: float) -> None:
        pass

    def close(self, reason: str = "exit", linger_ms: int | None = None) -> None:
        self.closed_with = (reason, linger_ms)


@pytest.fixture
def agent(monkeypatch):
    from trainmeter_agent._agent import Agent

    monkeypatch.delenv("TM_AGENT_FAULT", raising=False)
    agent = Agent("ipc:///nonexistent/in")
    agent.activated, agent.producer = True, CollectingProducer()  # as if hello had gone out
    agent.outbox.ready = True
    return agent


def sent(agent, kind: str) -> list:
    """What the agent has sent of a kind, once its open window has closed (the outbox flushes every 50 ms)."""
    agent.flush()
    return [r for r in agent.producer.records if records.kind_of(r) == kind]


def test_emit_and_a_tracker_tap_keep_and_refuse_the_same_values(agent, torch):
    import numpy

    from trainmeter_agent._tap_loader import TapSink

    values = {
        "float": 0.5,
        "int": 3,
        "flag": True,
        "cpu": torch.tensor(2.5),
        "numpy": numpy.int64(7),
        "complex": torch.tensor(1j),
        "python_complex": 1j,
        "meta": torch.tensor(1.0, device="meta"),  # stands in for an accelerator tensor
        "vector": torch.ones(2),
        "text": "x",
        "huge": 10**400,
    }
    agent.emit(dict(values))
    TapSink(agent, "fake")(dict(values), None)
    kept = {"float": 0.5, "int": 3.0, "flag": 1.0, "cpu": 2.5, "numpy": 7.0}
    assert [(m.origin, m.values) for m in sent(agent, "metric")] == [("emit", kept), ("fake", kept)]
    assert agent.stopped == set() and agent.emit_on


def test_a_declared_step_waits_and_an_optimizer_step_makes_the_hooks_the_step_clock(agent):
    agent.iterations.attached = True  # torch imported, hooks registered
    agent.emit({"step": 0, "loss": 2.0})  # the loop logs before its first optimizer step
    assert sent(agent, "step") == []
    agent.send_step({"step": 1})  # the hooks count iteration 1
    agent.emit({"step": 10, "tokens": 512, "loss": 1.0})  # now only a label, and tokens for the next step
    agent.send_step({"step": 2})
    steps = sent(agent, "step")
    assert [(s.step, s.tokens) for s in steps] == [(1, None), (2, 512)]
    assert [m.step for m in sent(agent, "metric")] == [0, 10]


def test_two_declared_steps_without_an_optimizer_step_between_are_both_sent(agent):
    agent.iterations.attached = True  # torch is there, but the loop updates its weights by hand
    agent.emit({"step": 1, "tokens": 100})
    agent.emit({"step": 2, "tokens": 100})
    agent.emit({"step": 3, "tokens": 100})
    steps = sent(agent, "step")
    assert [(s.step, s.tokens, s.tokens_source) for s in steps] == [(n, 100, "emitted") for n in (1, 2, 3)]
    assert steps[0].absent == {"step_time_s": "first step"} and steps[1].step_time_s > 0


def test_a_bad_step_value_is_refused_and_emit_goes_on(agent, capsys):
    agent.emit({"step": float("inf"), "loss": 1.0})
    agent.emit({"loss": 0.5})
    agent.flush()
    assert [m.values for m in sent(agent, "metric")] == [{"loss": 1.0}, {"loss": 0.5}]
    assert sent(agent, "step") == [] and agent.emit_on
    assert capsys.readouterr().err.count("tm: emit(step=...) got inf") == 1


def test_metrics_and_the_step_record_leave_in_one_batch_in_call_order_when_the_window_closes(agent):
    agent.outbox.window_s = float("inf")  # nothing leaves on time alone
    for value in (1.0, 2.0, 3.0):
        agent.emit({"loss": value})
    agent.send_step({"step": 1})
    agent.emit({"loss": 4.0})
    assert agent.producer.records == []  # queued: the loop paid for no send
    agent.outbox.max_records = 6
    agent.emit(
        {"loss": 5.0}
    )  # the sixth record closes the window: one batch, in the order the loop made them
    assert [records.kind_of(r) for r in agent.producer.records] == ["metric"] * 3 + ["step"] + ["metric"] * 2
    assert agent.producer.batches == 1
    assert [r.values["loss"] for r in agent.producer.records if records.kind_of(r) == "metric"] == [
        1,
        2,
        3,
        4,
        5,
    ]


def test_a_window_closes_on_its_own_within_its_deadline_when_the_loop_goes_quiet(agent):
    agent.outbox.window_s = 0.05
    agent.emit({"loss": 1.0})  # then the loop hangs: the timer thread closes the window
    deadline = time.monotonic() + 30
    while not agent.producer.records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r.values for r in agent.producer.records] == [{"loss": 1.0}]


def test_at_exit_closes_at_once_when_the_launcher_is_gone(agent, monkeypatch):
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    monkeypatch.setenv("TM_LAUNCHER_PID", finished.stdout.strip())
    producer = agent.producer
    agent.at_exit()
    assert producer.closed_with == ("exit", 0)


def test_hello_names_the_rank_and_world_that_torchrun_gives(monkeypatch):
    from trainmeter_agent._agent import Agent
    from trainmeter_core.bus import client as bus

    created: list[CollectingProducer] = []

    def producer(endpoint, source, *, rank=None):
        created.append(CollectingProducer())
        created[-1].rank = rank
        return created[-1]

    monkeypatch.setattr(bus, "Producer", producer)
    for name, value in {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TM_AGENT_FAULT", raising=False)
    agent = Agent("ipc:///nonexistent/in")
    assert agent.activate() is True
    hello = created[0].records[0]
    assert created[0].rank == 3
    assert (hello.local_rank, hello.world_size, hello.local_world_size, hello.node_rank) == (1, 8, 2, 1)
