"""The agent in depth: tokens and micro-batches, the model's shape, phases, counted FLOPs, and that none of it changes a
run or reaches the loop (tests/agent_scripts/gpt_loop.py, a small GPT on the CPU, under a real Hub and Recorder).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from deadline import wait_for
from test_agent import SCRIPTS, Run, kinds, plain_env, tm_lines

from trainmeter_agent._agent import MODEL_PROBES
from trainmeter_agent._iterations import AGENT_US_EVERY

# One busy process a test and nothing timed: these run beside the heavy tests, not in their line, together so that
# the module's fixtures are built once (docs/architecture.md, "Tests").
together = pytest.mark.xdist_group("agent_depth")
GPT = str(SCRIPTS / "gpt_loop.py")
NO_TOKENS = "no integer id tensor seen in the model's inputs: pass --tokens-per-step"


def gpt(run: Run, *args: str, **env: str) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run(
        [sys.executable, GPT, *args],
        env=run.env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=run.run_dir,
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: run.hub.kinds.get("bye", 0) >= 1, what="the agent's bye")
    return json.loads(done.stdout), done


def gpt_plain(*args: str, cwd=None) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run(
        [sys.executable, GPT, *args], env=plain_env(), capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done


def facts(records: list[dict]) -> dict[str, dict]:
    """The last fact of each name."""
    return {r["name"]: r for r in kinds(records, "fact")}


# --------------------------------------------------------------------------------------------------------------------
# Acceptance 1: a small GPT's tokens, micro-batches and shape


@together
def test_a_small_gpt_with_accumulation_and_eval_is_measured_as_the_model_counts_itself(run, torch):
    result, _ = gpt(run, "--steps", "6", "--accum", "4", "--eval-every", "2", "--dataloader")
    records = run.records()
    model = result["model"]
    found = facts(records)
    for name in ("params", "embedding_params", "layers", "d_model", "seq_len"):
        assert found[name]["value"] == model[name], name
        assert found[name]["provenance"] == "detected" and found[name]["origin"] == "agent:model"
    # N = 28032 (the tied lm_head shares wte's storage, counted once); E = wpe = 16 positions x 32 = 512.
    assert (found["params"]["value"], found["embedding_params"]["value"]) == (28032, 512)
    steps = kinds(records, "step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    # 4 micro-batches of 4 sequences x 16 tokens = 256 tokens per step; the eval passes (no_grad) add none.
    assert {
        (s["micro_batches"], s["tokens"], s["tokens_source"], s["dp"], s["tokens_global"]) for s in steps
    } == {(4, 256, "input_ids", 1, 256)}
    assert model["tokens_per_step"] == 256
    evals = [p for p in kinds(records, "phase") if p["phase"] == "eval"]
    assert [(p["step"], p["probe"]) for p in evals] == [
        (2, "model.eval"),
        (4, "model.eval"),
        (6, "model.eval"),
    ]
    assert all(p["end_t"] >= p["start_t"] for p in evals)
    data_waits = [p for p in kinds(records, "phase") if p["phase"] == "data_wait"]
    assert len(data_waits) == 6 * 4  # one DataLoader batch per micro-batch
    # what a measured peak must match: float32 parameters, no autocast, OMP_NUM_THREADS=1 (tm_env)
    assert found["device"]["value"] == {
        "type": "cpu",
        "index": None,
        "uuid": None,
        "dtype": "float32",
        "threads": 1,
    }
    assert (found["dp"]["value"], found["world_size"]["value"]) == (1, 1)
    for probe in ("model", "eval", "data_wait", "checkpoint", "compile", "flops"):
        assert found[f"probe.{probe}"]["value"] == "attached", probe


@together
def test_one_real_step_is_counted_with_the_flop_counter_and_marked(run, torch):
    gpt(run, "--steps", "4", "--accum", "2")
    records = run.records()
    counted = facts(records)["counted_flop_per_token"]
    # Matmul weights per token: 2 layers x (qkv 32x96 + proj 32x32 + mlp 32x128 + 128x32) + head 32x64 = 26624;
    # forward 2 and backward 4 FLOPs per weight: 6 x 26624 = 159744. Attention per token and layer (T 16, d 32), as
    # its math: forward QK^T and PV, 2 x 2 x 16 x 32 = 2048; backward 4 x 2 x 16 x 32 = 4096 (the CPU flash kernel's
    # recompute of QK^T is not counted). 159744 + 2 layers x (2048 + 4096) = 172032.
    assert counted["value"] == 172032.0 and counted["unit"] == "FLOP/token"
    assert "step 2" in counted["note"] and "2 micro-batches" in counted["note"]
    steps = kinds(records, "step")
    assert [s["step"] for s in steps if s.get("profiled")] == [
        2
    ]  # the counted step ran slower: kept out of averages


def test_a_loop_without_id_tensors_has_micro_batches_but_no_tokens(run, torch):
    run.python([str(SCRIPTS / "train_loop.py"), "plain", "5"], run.env())
    steps = kinds(run.records(), "step")
    assert [s["micro_batches"] for s in steps] == [1] * 5
    assert all("tokens" not in s and s["absent"]["tokens"] == NO_TOKENS for s in steps)


def test_emitted_tokens_win_over_detected_ones(run, torch):
    code = (
        "import torch\nfrom trainmeter_agent import emit\n"
        "torch.set_num_threads(1)\n"
        "emb = torch.nn.Embedding(10, 4)\nopt = torch.optim.SGD(emb.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n    emb(torch.zeros(2, 5, dtype=torch.long)).sum().backward()\n"
        "    emit(tokens=7)\n    opt.step()\n"
    )
    run.python(["-c", code], run.env())
    steps = kinds(run.records(), "step")
    # Detected: 2 x 5 = 10 ids per step; the loop declared 7, and a declared number wins.
    assert [(s["tokens"], s["tokens_source"], s["tokens_global"]) for s in steps] == [(7, "emitted", 7)] * 3


# --------------------------------------------------------------------------------------------------------------------
# Phases


@together
def test_checkpoints_are_phases_with_the_files_they_wrote(run, torch, tmp_path):
    _require("safetensors")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    gpt(run, "--steps", "2", "--save", str(folder))
    checkpoints = [p for p in kinds(run.records(), "phase") if p["phase"] == "checkpoint"]
    assert [(p["probe"], p["paths"]) for p in checkpoints] == [
        ("torch.save", [str(folder / "model.pt")]),
        ("torch.distributed.checkpoint.save", [str(folder / "dcp")]),
        ("safetensors.save_file", [str(folder / "model.safetensors")]),
    ]
    # The folders they went to, said once each as they appear (the host sampler watches their filesystems).
    said = [f for f in kinds(run.records(), "fact") if f["name"] == "checkpoint.folders"]
    assert [f["value"] for f in said] == [[str(folder)], [str(folder), str(folder / "dcp")]]


@together
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_stay_dormant(run, torch, context):
    gpt(run, "--steps", "3", "--dataloader", "--workers", "1", "--worker-context", context)
    records = run.records()
    assert len({r["pid"] for r in records}) == 1  # the trainer alone: no worker said hello
    assert [s["step"] for s in kinds(records, "step")] == [1, 2, 3]


# --------------------------------------------------------------------------------------------------------------------
# Acceptance 2: the loss curve is the same with and without tm


def _same_run(tmp_path, run: Run, options: list[str]) -> tuple[dict, list[dict], str]:
    """Run ``options`` twice without tm (the control) and once with it; every loss and the final state must agree."""
    states = {name: tmp_path / f"{name}.pt" for name in ("plain", "control", "tm")}
    plain, plain_done = gpt_plain(*options, "--state", str(states["plain"]), cwd=tmp_path)
    control, _ = gpt_plain(*options, "--state", str(states["control"]), cwd=tmp_path)
    measured, done = gpt(run, *options, "--state", str(states["tm"]))
    assert control["losses"] == plain["losses"]  # the loop itself is deterministic
    assert measured["losses"] == plain["losses"]  # bit for bit, as float.hex
    import torch

    loaded = {name: torch.load(path) for name, path in states.items()}
    for name in ("control", "tm"):
        assert loaded[name]["model"].keys() == loaded["plain"]["model"].keys()
        assert all(torch.equal(loaded[name]["model"][k], v) for k, v in loaded["plain"]["model"].items()), (
            name
        )
        assert torch.equal(loaded[name]["rng"], loaded["plain"]["rng"]), name
    extra = [line for line in done.stderr.splitlines() if line not in plain_done.stderr.splitlines()]
    return measured, extra, done.stderr


@together
def test_three_hundred_steps_give_the_same_losses_and_weights_with_and_without_tm(run, torch, tmp_path):
    measured, extra, _ = _same_run(tmp_path, run, ["--steps", "300", "--accum", "2", "--eval-every", "50"])
    assert len(measured["losses"]) == 300
    assert extra == []  # no line (warning or tm:) that the plain run did not print
    records = run.records()
    assert len(kinds(records, "step")) == 300
    # The agent's own cost per step, published at step 16, then at step 256 (timed steps, both) when a second or more
    # went by since, with the drops so far.
    overhead = [f for f in kinds(records, "fact") if f["name"] == "agent_overhead_us"]
    assert 1 <= len(overhead) <= 2 and all(f["value"] > 0 and f["unit"] == "us/step" for f in overhead)
    assert " steps up to 16;" in overhead[0]["note"]
    if len(overhead) == 2:
        assert " steps up to 256;" in overhead[1]["note"] and overhead[1]["t"] - overhead[0]["t"] > 0.99
    assert overhead[-1]["note"].endswith("records dropped so far: 0")


@together
def test_three_hundred_steps_are_the_same_with_the_tensorboard_tap_on(run, torch, tmp_path):
    _require("tensorboard")
    options = ["--steps", "300", "--tensorboard", str(tmp_path / "tb")]
    measured, extra, _ = _same_run(tmp_path, run, options)
    assert extra == []
    tapped = [m for m in kinds(run.records(), "metric") if m.get("origin") == "tensorboard"]
    assert len([m for m in tapped if "loss/train" in m["values"]]) == 300


@together
def test_three_hundred_compiled_steps_are_the_same_and_measured_through_the_compiled_model(
    run, torch, tmp_path
):
    options = ["--steps", "300", "--compile"]
    measured, extra, stderr = _same_run(tmp_path, run, options)
    assert extra == [], stderr  # in particular no "global hooks on modules" warning from torch.compile
    records = run.records()
    steps = kinds(records, "step")
    assert {(s["micro_batches"], s["tokens"]) for s in steps} == {
        (1, 64)
    }  # 4 x 16 through the OptimizedModule
    compiles = [p for p in kinds(records, "phase") if p["phase"] == "compile"]
    assert len(compiles) == 1 and compiles[0]["detail"] == "first call of compiled GPT"
    counted = facts(records)["counted_flop_per_token"]
    # Counted on an uncompiled meta copy: 6 x 26624 = 159744 for the weights, and attention through the math kernels
    # (2 forward and 4 backward T x T matmuls, no recompute): 2 layers x 6 x 2 x 16 x 32 = 12288; 172032 in all.
    assert counted["value"] == 172032.0 and "meta copy" in counted["note"]


def _require(module: str) -> None:
    import importlib.util
    import os

    if importlib.util.find_spec(module) is None:
        if os.environ.get("TM_REQUIRE_TORCH") == "1":
            pytest.fail(
                f"{module} is required here (TM_REQUIRE_TORCH=1): pip install -r requirements-test.txt"
            )
        pytest.skip(f"{module} is not installed: pip install -r requirements-test.txt")


# --------------------------------------------------------------------------------------------------------------------
# Invariant 1: an internal error in any probe goes quiet with one line; the user's errors are untouched


@pytest.fixture(scope="module")
def probe_control(tmp_path_factory):
    """Losses of the loop that uses every probe, without tm (and with torch.compile for the compile probe)."""
    folder = tmp_path_factory.mktemp("control")
    options = ["--steps", "4", "--accum", "2", "--eval-every", "2", "--dataloader", "--save", str(folder)]
    return {
        compiled: (
            options + (["--compile"] if compiled else []),
            gpt_plain(*options, *(["--compile"] if compiled else []))[0],
        )
        for compiled in (False, True)
    }


@together
@pytest.mark.parametrize("probe", MODEL_PROBES)
def test_an_internal_error_in_a_model_probe_says_one_line_and_changes_no_loss(
    run, torch, probe_control, probe
):
    options, plain = probe_control[probe == "compile"]
    measured, done = gpt(run, *options, TM_AGENT_FAULT=probe)
    assert measured["losses"] == plain["losses"]
    lines = tm_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"tm: agent {probe} stopped: InjectedFault"), done.stderr
    notices = kinds(run.records(), "notice")
    assert [n["topic"] for n in notices] == [f"agent.{probe}"]
    assert facts(run.records())[f"probe.{probe}"]["value"] == "not attached: stopped after an internal error"


@together
@pytest.mark.parametrize(
    ("error", "expected"),
    [("forward", "ValueError"), ("stop_iteration", "StopIteration"), ("interrupt", "KeyboardInterrupt")],
)
def test_the_users_own_errors_reach_the_loop_as_without_tm(run, torch, error, expected):
    plain, _ = gpt_plain("--steps", "2", "--dataloader", "--error", error)
    measured, done = gpt(run, "--steps", "2", "--dataloader", "--error", error)
    assert measured["error"] == plain["error"]
    assert measured["error"]["type"] == expected and measured["error"]["same"]
    assert tm_lines(done.stderr) == []


# --------------------------------------------------------------------------------------------------------------------
# The pieces, in this process


@pytest.fixture
def gpt_module(torch):
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpt_loop
    finally:
        sys.path.remove(str(SCRIPTS))
    torch.manual_seed(0)
    return gpt_loop


def test_n_counts_a_tied_head_once_and_e_only_the_lookup_tables(gpt_module):
    from trainmeter_agent import _shape

    model = gpt_module.GPT(gpt_module.GPTConfig())
    n_params, embedding, why = _shape.count_params(model)
    # wte 64x32 = 2048 is also lm_head's weight: counted once in N and kept out of E; E is wpe, 16 x 32 = 512.
    assert (n_params, embedding, why) == (28032, 512, None)
    untied = gpt_module.GPT(gpt_module.GPTConfig())
    untied.lm_head.weight = type(untied.wte.weight)(untied.wte.weight.detach().clone())
    # An untied head adds its own 2048 to N and leaves the token table a pure lookup: E = 512 + 2048.
    assert _shape.count_params(untied)[:2] == (28032 + 2048, 512 + 2048)


def test_shape_comes_from_hf_and_dataclass_configs_through_wrappers(torch):
    from trainmeter_agent import _shape

    class HFConfig:  # the names a PretrainedConfig answers to (GPT-2's through its attribute_map)
        num_hidden_layers, hidden_size, max_position_embeddings, num_local_experts = 24, 1024, 2048, 8

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = HFConfig()
            self.proj = torch.nn.Linear(2, 2)

    class Wrapper(torch.nn.Module):  # as torch.compile's OptimizedModule holds the model under _orig_mod
        def __init__(self) -> None:
            super().__init__()
            self._orig_mod = Inner()

    wrapper = Wrapper()
    assert _shape.unwrap(wrapper) == [wrapper, wrapper._orig_mod]
    found = {name: (value, extra) for name, value, extra in _shape.shape_facts(wrapper)}
    assert {name: found[name][0] for name in ("layers", "d_model", "seq_len", "moe_experts")} == {
        "layers": 24,
        "d_model": 1024,
        "seq_len": 2048,
        "moe_experts": 8,
    }
    assert (
        found["moe_experts"][1]["warning"]
        == "total parameters overstate FLOPs; declare the active parameters with --params"
    )


def test_dp_is_one_for_one_process_and_absent_for_ranks_without_a_wrapper(torch, monkeypatch):
    from trainmeter_agent import _shape

    model = torch.nn.Linear(2, 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _shape.data_parallel_degree(model) == (1, "a single process")
    monkeypatch.setenv("WORLD_SIZE", "4")
    dp, why = _shape.data_parallel_degree(model)
    assert dp is None and why.endswith("pass --dp")


def test_a_meta_copy_runs_forward_and_backward_without_touching_the_model_or_the_rng(gpt_module, torch):
    from trainmeter_agent._flops import meta_copy

    model = gpt_module.GPT(gpt_module.GPTConfig())
    copy = meta_copy(model, torch)
    assert copy.lm_head.weight is copy.wte.weight  # the tie survives the copy
    assert all(p.device.type == "meta" for p in copy.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())
    rng = torch.get_rng_state()
    ids = torch.empty(2, 16, dtype=torch.long, device="meta")
    with torch.device("meta"):
        copy(ids, ids)[1].backward()  # dropout is on: on meta it draws nothing
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


def test_the_watcher_runs_callbacks_after_the_modules_own_code_and_keeps_import_errors_the_users(
    tmp_path, monkeypatch
):
    from trainmeter_agent._import_watch import ModuleWatcher

    (tmp_path / "tm_watched_ok.py").write_text("VALUE = 41 + 1\n")
    (tmp_path / "tm_watched_broken.py").write_text("raise ImportError('the users own')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    errors, seen = [], []
    watcher = ModuleWatcher(lambda probe, exc: errors.append((probe, type(exc).__name__)))
    watcher.watch("tm_watched_ok", "a", lambda module: seen.append(module.VALUE))
    watcher.watch("tm_watched_ok", "b", lambda module: 1 / 0)
    watcher.watch("tm_watched_broken", "c", lambda module: seen.append("never"))
    try:
        import tm_watched_ok  # noqa: F401

        with pytest.raises(ImportError, match="the users own"):
            import tm_watched_broken  # noqa: F401
    finally:
        for name in ("tm_watched_ok", "tm_watched_broken"):
            sys.modules.pop(name, None)
    assert seen == [42] and errors == [("b", "ZeroDivisionError")]
    assert watcher not in sys.meta_path  # nothing left to watch: it left


# --------------------------------------------------------------------------------------------------------------------
# The steady step path (issue 16): the same records as the general one


# Run gpt_loop.py with the agent's steady paths switched off (Agent.lean): every step record is built by send_step from
# its fields, every phase record in agent.phase at once (as before the outbox held them as tuples).
_GENERAL_ONLY = """
import runpy, sys
from trainmeter_agent._agent import Agent
from trainmeter_core.model import records
Agent.lean = False
Agent.send_steady_step = lambda self, *args: False
def phase(self, name, start_t, end_t, *, probe, **extra):
    record = records.Phase(
        phase=name, start_t=start_t, end_t=end_t, step=self.current_step(), probe=probe, t=end_t, **extra
    )
    if self.activated:
        self._queue_record(record, end_t)
    else:
        self._held.append(record)
Agent.phase = phase
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# What differs between two runs of one deterministic loop: the clocks, the process and its counters.
_RUN_DEPENDENT = {"t", "wall", "step_time_s", "agent_us", "start_t", "end_t", "pid", "seq", "dropped"}


@together
def test_the_steady_step_path_sends_the_records_the_general_path_sends(run, torch):
    args = ["--steps", "34", "--accum", "2", "--eval-every", "4", "--dataloader"]
    run.python([GPT, *args], run.env(), byes=1)
    run.python(["-c", _GENERAL_ONLY, GPT, *args], run.env(), byes=2)
    records = run.records()
    pids = list(dict.fromkeys(r["pid"] for r in records))
    assert len(pids) == 2

    def loop_records(pid: int) -> list[dict]:
        kept = [r for r in records if r["pid"] == pid and r["kind"] in ("step", "metric", "phase")]
        return [{k: v for k, v in r.items() if k not in _RUN_DEPENDENT} for r in kept]

    steady, general = loop_records(pids[0]), loop_records(pids[1])
    assert [r["kind"] for r in steady] == [r["kind"] for r in general]  # the same records in the same order
    assert steady == general
    steps = [r for r in steady if r["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, 35))
    # Each steady step still carries its step time, and the agent's own time where it timed itself: step 16, 32, ...
    for pid in pids:
        later = [r for r in records if r["pid"] == pid and r["kind"] == "step" and r["step"] > 1]
        assert all(r["step_time_s"] > 0 for r in later)
        assert (
            [r["step"] for r in later if "agent_us" in r] == [16, 32] == list(range(16, 35, AGENT_US_EVERY))
        )
        assert all(r["agent_us"] > 0 for r in later if "agent_us" in r)


@together
def test_a_loop_without_token_ids_takes_the_steady_path_and_sends_what_the_general_path_sends(run, torch):
    # train_loop.py feeds its model floats: each step has micro-batches and no token count, and its reason.
    args = [str(SCRIPTS / "train_loop.py"), "plain", "40"]
    run.python(args, run.env(), byes=1)
    run.python(["-c", _GENERAL_ONLY, *args], run.env(), byes=2)
    records = run.records()
    pids = list(dict.fromkeys(r["pid"] for r in records))
    assert len(pids) == 2
    # The steady way's steps travelled in blocks, which said once why they have no tokens; the general way's alone.
    logged = [json.loads(line) for line in (run.run_dir / "events-0001.jsonl").read_text().splitlines()]
    blocks = [b for b in logged if b["kind"] == "block" and b["pid"] == pids[0] and "s" in b["order"]]
    # Every step but the process's first and the FLOP counter's (step 2, profiled), each a step record of its own
    assert sum(b["order"].count("s") for b in blocks) == 38
    alone = [r["step"] for r in logged if r["kind"] == "step" and r["pid"] == pids[0]]
    assert alone == [1, 2]
    assert all(b["tokens_absent"] == NO_TOKENS and "tokens" not in b for b in blocks)
    assert not [b for b in logged if b["kind"] == "block" and b["pid"] == pids[1] and "s" in b["order"]]

    def loop_records(pid: int) -> list[dict]:
        kept = [r for r in records if r["pid"] == pid and r["kind"] in ("step", "metric", "phase")]
        return [{k: v for k, v in r.items() if k not in _RUN_DEPENDENT} for r in kept]

    steady, general = loop_records(pids[0]), loop_records(pids[1])
    assert steady == general
    steps = [r for r in steady if r["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, 41))
    assert all(s["absent"]["tokens"] == NO_TOKENS and "tokens" not in s for s in steps)
    assert all(s["absent"] == {"tokens": NO_TOKENS} for s in steps[1:])  # the first also has no step time
    assert {s["micro_batches"] for s in steps} == {1}


# --------------------------------------------------------------------------------------------------------------------
# Whole models leave the process as they would without tm: copy.deepcopy and torch.save(model)

COPY_MODEL = str(SCRIPTS / "copy_model.py")
# Loads a whole pickled model with nothing of trainmeter importable, runs it, and names the hooks it carries.
_LOAD_PLAIN = """
import json, sys
import torch
model = torch.load(sys.argv[1], weights_only=False)
out = model(torch.randint(16, (2, 8)))
hooks = [getattr(h, "__qualname__", type(h).__qualname__) for h in model._forward_pre_hooks.values()]
print(json.dumps({"shape": list(out.shape), "hooks": hooks, "own_forward": "forward" in model.__dict__,
                  "trainmeter": [m for m in sys.modules if "trainmeter" in m]}))
"""


@together
def test_a_model_deep_copied_and_saved_whole_under_tm_behaves_as_without_it(run, torch, tmp_path):
    done = run.python([COPY_MODEL, str(tmp_path / "with-tm.pt")], run.env())
    with_tm = json.loads(done.stdout)
    plain = subprocess.run(
        [sys.executable, COPY_MODEL, str(tmp_path / "plain.pt")],
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    # The EMA copy trained to the same loss, bit for bit: the copy took nothing along that changes its training.
    assert with_tm["ema_loss"] == json.loads(plain.stdout)["ema_loss"]
    assert not tm_lines(done.stderr)  # no probe stopped on the copy or the save
    steps = kinds(run.records(), "step")
    # The EMA's optimizer is a second optimizer: its first step joins iteration 3 (as Muon beside AdamW would), its
    # second starts iteration 4.
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    # The copy's forwards are not the model's micro-batches: the probe's forward stayed behind with the model.
    assert [s.get("micro_batches") for s in steps] == [1, 1, 1, None]
    assert steps[3]["absent"]["micro_batches"] == "the model's forward was not seen in this step"
    # The saved model loads and runs where trainmeter cannot even be imported.
    env = {k: v for k, v in plain_env().items() if k != "PYTHONPATH"}
    loaded = subprocess.run(
        [sys.executable, "-I", "-c", _LOAD_PLAIN, str(tmp_path / "with-tm.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr
    result = json.loads(loaded.stdout)
    assert result["shape"] == [2, 8, 16] and result["trainmeter"] == []
    # Nothing of the probe went along: no hook, and the class's own forward (the probe's was left out of the pickle).
    assert result["hooks"] == [] and result["own_forward"] is False
