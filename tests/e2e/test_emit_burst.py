"""emit() never blocks and never loses a record silently: what the log holds plus what was dropped is what was sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from deadline import wait_for
from tm_runs import REPO, log_records, only_run, run_tm

BURST = 200_000


@pytest.mark.xdist_group("heavy")
def test_a_burst_of_200k_emits_is_all_accounted_for(tm_env, tmp_path):
    code = f"from trainmeter_agent import emit\nfor i in range({BURST}):\n    emit(burst=float(i))\n"
    result = run_tm(["--", sys.executable, "-c", code], tm_env, timeout=300)
    assert result.returncode == 0, result.stderr
    run = only_run(tmp_path / "runs")
    got = log_records(run)
    logged = [r for r in got if r["kind"] == "metric" and "burst" in r["values"]]
    summary = json.loads((run / "summary.json").read_text())
    dropped = summary["bus"]["dropped_total"]
    assert len(logged) + dropped == BURST
    # The drops are also on the bus: the final bus.stats carries the same count.
    final_stats = [r for r in got if r["kind"] == "bus.stats" and r.get("final")]
    assert final_stats and final_stats[-1].get("dropped_total", 0) == dropped
    values = [r["values"]["burst"] for r in logged]
    assert values == sorted(values)  # in order, nothing duplicated
    print(f"{len(logged)} logged, {dropped} dropped")


# Not heavy: it waits out the hub's absence (4.1 s of CPU in its 64 s, measured alone), so it runs beside the heavy tests
# instead of holding up their one-at-a-time line for a minute.
def test_with_the_hub_gone_the_process_stays_small_and_counts_exactly(tm_env, tmp_path, short_dir):
    """The hub is absent while the loop emits (60 s by default, TM_HUB_GONE_S to shorten), then comes back."""
    from trainmeter_core.bus.hub import Hub
    from trainmeter_core.model import records
    from trainmeter_core.runlog.recorder import Recorder

    gone_s = float(os.environ.get("TM_HUB_GONE_S", "60"))
    endpoint = f"ipc://{short_dir}/in"
    back = tmp_path / "hub-is-back"
    script = textwrap.dedent(
        f"""
        import os, time, pathlib
        from trainmeter_agent import emit
        def rss_mb():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        emit(warmup=1.0)
        before = rss_mb()
        start = time.monotonic()
        for i in range({BURST}):
            emit(gone=float(i))
            if i % 1000 == 999:
                # spread the burst over the hub's absence
                time.sleep(max(0.0, start + {gone_s} * (i + 1) / {BURST} - time.monotonic()))
        print(f"grew {{rss_mb() - before:.1f}} MB", flush=True)
        while not pathlib.Path({str(back)!r}).exists():
            time.sleep(0.05)
        """
    )
    env = dict(
        tm_env,
        TM_AGENT="1",
        TM_AGENT_ENDPOINT=endpoint,
        TM_RUN_DIR=str(tmp_path),
        TM_LAUNCHER_PID=str(os.getpid()),
    )
    env["PYTHONPATH"] = f"{REPO / 'trainmeter_agent' / 'boot'}{os.pathsep}{REPO}"
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    grew_line = proc.stdout.readline()
    assert grew_line.startswith("grew "), grew_line
    grew_mb = float(grew_line.split()[1])
    assert grew_mb < 50, f"the training process grew by {grew_mb} MB while the hub was gone"

    recorder = Recorder(tmp_path)
    recorder.start()
    hub = Hub(endpoint, f"ipc://{short_dir}/out", recorder)
    hub.start()
    back.write_text("1")
    assert proc.wait(60) == 0
    wait_for(lambda: not hub.open_producers and hub.kinds.get("bye"), what="the agent's bye")
    hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=gone_s))
    recorder.close()
    got = log_records(tmp_path)
    kept = sum(1 for r in got if r["kind"] == "metric" and "gone" in r["values"])
    (bye,) = [r for r in got if r["kind"] == "bye"]
    assert kept + bye.get("dropped", 0) == BURST
    print(f"hub gone {gone_s} s: grew {grew_mb} MB, kept {kept}, dropped {bye.get('dropped', 0)}")
