"""``tm import``: into a finished run (its log reopened as a new segment, summary and passport rewritten), refused in
one line with exit 2 and nothing written, fuzzed traces never crashing it or ``tm view``; and a torch.profiler trace
recorded inside a CPU run under tm, picked up at the run's end with the run's own step numbers."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest
from tm_runs import REPO, log_records, only_run, run_tm

TRACES = REPO / "tests" / "fixtures" / "traces"
A100 = TRACES / "a100-nccl-rank0.pt.trace.json.gz"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One short finished run, made once; each test works on its own copy."""
    import os

    base = tmp_path_factory.mktemp("made")
    env = dict(os.environ, TM_RUNS_DIR=str(base / "runs"), OMP_NUM_THREADS="1")
    done = run_tm(["--no-web", "-q", "--name", "short", "--", "python", "-c", "print('ok')"], env)
    assert done.returncode == 0, done.stderr
    return only_run(base / "runs")


@pytest.fixture
def run_dir(finished_run, tmp_path) -> Path:
    copy = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, copy)
    return copy


def tm_import(run_dir: Path, *args: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from trainmeter_core.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["import", str(run_dir), *args])
    return code, out.getvalue(), err.getvalue()


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != "run.lock"}


def test_a_trace_from_another_process_is_refused_in_one_line_and_nothing_is_written(run_dir):
    before = files_of(run_dir)
    code, out, err = tm_import(run_dir, str(A100))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "comes from process 2910249, which is none of this run's" in err
    assert "pass --force" in err and files_of(run_dir) == before


def test_a_file_no_importer_reads_names_the_importers_tried(run_dir, tmp_path):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello")
    before = files_of(run_dir)
    code, _, err = tm_import(run_dir, str(odd))
    assert code == 2 and "notes.txt: no importer reads it (tried: " in err and err.count("\n") == 1
    assert "kineto" in err.split("tried: ", 1)[1]
    assert files_of(run_dir) == before


def test_a_forced_import_into_a_finished_run_reopens_its_log_as_a_new_segment(run_dir):
    last_seq = log_records(run_dir)[-1]["seq"]
    code, out, err = tm_import(run_dir, str(A100), "--force")
    assert code == 0, err
    assert out.startswith(
        "rank 0 ProfilerStep#4-6: 667.2 ms: gemm 6%, other compute 11%, communication 6%, idle 76%"
    )
    second = [json.loads(line) for line in (run_dir / "events-0002.jsonl").read_text().splitlines()]
    # Three profiled steps and the trace, numbered on from the run's last record.
    assert [r["kind"] for r in second] == ["profile.import"] * 4
    assert [r["seq"] for r in second] == [last_seq + 1, last_seq + 2, last_seq + 3, last_seq + 4]
    assert [r.get("profiler_step") for r in second[:3]] == [4, 5, 6] and second[3].get(
        "scope", "trace"
    ) == "trace"
    summary = json.loads((run_dir / "summary.json").read_text())
    trace = summary["snapshot"]["profile"]["traces"][0]
    assert trace["hta"]["idle_pct"] == 77.78 and summary["records"]["profile.import"] == 4
    assert "## Profile" in (run_dir / "passport.md").read_text()
    # tm view --json replays the checkpoint and the new segment: the same profile.
    view = run_tm(
        ["view", "--json", str(run_dir)], {"PATH": str(Path(REPO / ".venv" / "bin")), "HOME": "/tmp"}
    )
    assert view.returncode == 0, view.stderr
    assert json.loads(view.stdout)["profile"]["traces"][0]["trace_id"] == trace["trace_id"]


def test_importing_the_same_trace_again_replaces_it_rather_than_counting_it_twice(run_dir):
    for _ in range(2):
        assert tm_import(run_dir, str(A100), "--force")[0] == 0
    profile = json.loads((run_dir / "summary.json").read_text())["snapshot"]["profile"]
    assert profile["imported"] == 1 and len(profile["steps"]) == 3


def test_a_folder_of_two_ranks_gives_a_breakdown_per_rank_and_the_spread_between_them(run_dir, tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(TRACES / f"sampled-rank{r}.pt.trace.json.gz", folder)
    code, out, err = tm_import(run_dir, str(folder), "--force")
    assert code == 0, err
    assert [line.split(" ")[1] for line in out.splitlines()] == ["0", "1"]
    profile = json.loads((run_dir / "summary.json").read_text())["snapshot"]["profile"]
    assert [t["rank"] for t in profile["traces"]] == [0, 1]
    shares = [t["split_s"]["communication"] / t["window_s"] for t in profile["traces"]]
    assert profile["spread"]["communication"] == pytest.approx(max(shares) - min(shares))


def test_a_cut_trace_is_refused_and_the_others_of_the_same_import_are_not_written_either(run_dir, tmp_path):
    cut = tmp_path / "cut.pt.trace.json.gz"
    cut.write_bytes(gzip.compress(gzip.decompress(A100.read_bytes())[:300_000]))
    before = files_of(run_dir)
    code, _, err = tm_import(run_dir, str(A100), str(cut), "--force")
    assert code == 2 and "cut.pt.trace.json.gz" in err and "nothing imported" in err
    assert files_of(run_dir) == before


# --------------------------------------------------------------------------------------------------------------------
# Fuzzed traces: cut, bytes flipped, wrong types, huge numbers (fixed seeds, printed on failure)

SEEDS = [11, 23, 37, 41, 53, 67, 79, 83]


def mutate(data: bytes, seed: int) -> tuple[bytes, str]:
    rng = random.Random(seed)
    how = ["cut", "flip", "wrong type", "huge"][seed % 4]
    if how == "cut":
        return data[: rng.randrange(len(data))], how
    if how == "flip":
        out = bytearray(data)
        for _ in range(20):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out), how
    if how == "wrong type":
        return data.replace(b'"dur": ', b'"dur": "x', 1).replace(b'"stream": 7', b'"stream": {}', 3), how
    return data.replace(b'"dur": ', b'"dur": 1e308 + ', 1).replace(b'"ts": 4', b'"ts": 9e307', 5), how


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fuzzed_trace_never_crashes_tm_import_or_tm_view_and_is_all_or_nothing(run_dir, tmp_path, seed):
    data, how = mutate(gzip.decompress(A100.read_bytes()), seed)
    fuzzed = tmp_path / f"fuzz{seed}.pt.trace.json"
    fuzzed.write_bytes(data)
    before = files_of(run_dir)
    code, out, err = tm_import(run_dir, str(fuzzed), "--force")
    assert code in (0, 2), f"seed {seed} ({how}): {err}"
    segments = sorted(p.name for p in run_dir.glob("events-*"))
    if code == 2:
        assert files_of(run_dir) == before, f"seed {seed} ({how}) wrote part of a refused import"
        assert err.count("\n") == 1, f"seed {seed} ({how}): {err}"
    else:
        written = [json.loads(line) for line in (run_dir / "events-0002.jsonl").read_text().splitlines()]
        assert written[-1].get("scope", "trace") == "trace" and segments == [
            "events-0001.jsonl",
            "events-0002.jsonl",
        ]
    from trainmeter_core.commands.view import print_final_snapshot

    assert print_final_snapshot(str(run_dir), None) == 0, f"seed {seed} ({how})"


# --------------------------------------------------------------------------------------------------------------------
# A torch.profiler trace recorded inside a run under tm


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_torch_profiler_trace_written_inside_a_cpu_run_is_imported_at_its_end_with_the_runs_steps(
    torch, tm_env, tmp_path
):
    traces = tmp_path / "traces"
    script = REPO / "tests" / "agent_scripts" / "profiled_loop.py"
    done = run_tm(["--no-web", "--name", "prof", str(script), str(traces)], tm_env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "tm: profile imported: process ProfilerStep#3-5 = step 4-6" in done.stderr, done.stderr
    run_dir = only_run(Path(tm_env["TM_RUNS_DIR"]))
    records = log_records(run_dir)
    kinds = [r["kind"] for r in records]
    # Imported before run.end, so the final numbers hold them.
    assert kinds.index("profile.import") < kinds.index("run.end")
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    imported = [r for r in records if r["kind"] == "profile.import" and r.get("scope") == "step"]
    # The profiler's steps #3-#5 are the loop's 4th to 6th iterations: the run's steps 4, 5 and 6, each of which
    # the agent marked profiled, and whose step record was sent inside the profiler's step.
    assert [(r["profiler_step"], r["step"]) for r in imported] == [(3, 4), (4, 5), (5, 6)]
    for r in imported:
        assert steps[r["step"]].get("profiled") is True
        assert r["step_start_wall"] <= steps[r["step"]]["wall"] <= r["step_end_wall"]
    facts = [r for r in records if r["kind"] == "fact" and r["name"] == "profiler.trace_dir"]
    assert [f["value"] for f in facts] == [str(traces)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["snapshot"]["profile"]["traces"][0]["steps"] == [4, 5, 6]


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_an_internal_error_in_the_profiler_probe_says_one_line_and_the_loss_is_unchanged(
    torch, tm_env, tmp_path
):
    import subprocess
    import sys

    script = REPO / "tests" / "agent_scripts" / "profiled_loop.py"
    plain = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "plain")], capture_output=True, text=True, env=tm_env
    )
    env = dict(tm_env, TM_AGENT_FAULT="profiler")
    done = run_tm(["--no-web", "-q", str(script), str(tmp_path / "faulted")], env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["losses"] == json.loads(plain.stdout)["losses"]
    lines = [line for line in done.stderr.splitlines() if line.startswith("tm: agent")]
    assert lines == ["tm: agent profiler stopped: InjectedFault: injected by TM_AGENT_FAULT=profiler"]


def test_a_broken_importer_plugin_is_reported_and_skipped_and_the_others_still_read():
    from trainmeter_core import builtin, hookimpl
    from trainmeter_core.plugins import Plugins
    from trainmeter_core.run.profile_import import load_importers

    class Broken:
        @hookimpl
        def trainmeter_profiler_importers(self):
            raise RuntimeError("no GPU here")

    class NotAnImporter:
        @hookimpl
        def trainmeter_profiler_importers(self):
            return [object()]

    plugins = Plugins()
    plugins.register(builtin, "core", builtin=True)
    plugins.register(Broken(), "broken")
    plugins.register(NotAnImporter(), "odd")
    importers, problems = load_importers(plugins)
    assert [i.name for i in importers] == ["kineto"]
    assert any(p.startswith("plugin broken not used") and "RuntimeError: no GPU here" in p for p in problems)
    assert any(p.startswith("plugin odd:") and "is no profiler importer" in p for p in problems)


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_an_import_into_a_live_run_goes_through_its_hub_and_the_final_numbers_hold_it(tm_env, tmp_path):
    import subprocess
    import time

    from deadline import wait_for
    from tm_runs import TM

    stop = tmp_path / "stop"
    loop = f"import os, time\nwhile not os.path.exists({str(stop)!r}):\n    time.sleep(0.05)\n"
    proc = subprocess.Popen(
        [TM, "--no-web", "-q", "--no-agent", "--", "python", "-c", loop],
        env=tm_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        runs = Path(tm_env["TM_RUNS_DIR"])
        run_dir = wait_for(lambda: runs.is_dir() and any(runs.iterdir()) and only_run(runs), what="the run")
        wait_for(lambda: (run_dir / "meta.json").exists(), what="meta.json")
        done = run_tm(["import", str(run_dir), str(A100), "--force"], tm_env)
        assert done.returncode == 0, done.stderr
        assert "through its hub" in done.stderr
        wait_for(lambda: "profile.import" in (run_dir / "events-0001.jsonl").read_text(), what="the records")
        time.sleep(0.2)
    finally:
        stop.write_text("")
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    kinds = [r["kind"] for r in log_records(run_dir)]
    assert kinds.count("profile.import") == 4 and kinds.index("profile.import") < kinds.index("run.end")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["snapshot"]["profile"]["traces"][0]["hta"]["idle_pct"] == 77.78


def test_an_import_with_the_hubs_thread_order_forced_writes_every_record_it_counts(run_dir, monkeypatch):
    """The interleaving that lost a record: the hub's thread has looked at its inbox and is about to see the stop
    request when the last record is injected. Forced here: the hub waits in its flush until ``stop`` is called."""
    import sys
    import threading

    from trainmeter_core.bus.hub import Hub

    in_flush, go = threading.Event(), threading.Event()
    inject, stop = Hub.inject, Hub.stop
    injected = []

    def gated_inject(self, record):
        injected.append(record)
        if len(injected) == 4:  # the last of the trace's 4 records: wait until the hub sits past its inbox
            flush = self.out.flush

            def gated_flush():
                flush()
                # Only the flush that ends a pass of the hub's loop (the publisher flushes itself when full).
                if not go.is_set() and sys._getframe(1).f_code.co_name == "_serve":
                    in_flush.set()
                    go.wait(10)

            self.out.flush = gated_flush
            self._wake()
            assert in_flush.wait(10), "the hub never reached its flush"
        inject(self, record)

    def releasing_stop(self, timeout_s=10.0):
        self._stop_requested = True  # set before the hub moves on, as the race had it
        go.set()
        stop(self, timeout_s)

    monkeypatch.setattr(Hub, "inject", gated_inject)
    monkeypatch.setattr(Hub, "stop", releasing_stop)
    code, out, err = tm_import(run_dir, str(A100), "--force")
    assert len(injected) == 4 and code == 0, err
    assert "imported 1 file (4 records)" in err, err
    second = [json.loads(line) for line in (run_dir / "events-0002.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in second] == ["profile.import"] * 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["records"]["profile.import"] == 4 and summary["snapshot"]["profile"]["traces"]
