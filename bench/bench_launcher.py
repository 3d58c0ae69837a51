"""What tm itself costs: the fixed cost of ``tm -- python -c pass`` beside the previous generation (trainmeter 0.0.7),
where that time goes (a timeline of one run, the import time of each process), time to the child's start, idle CPU
and memory, a component's restart.

Prints figures and ratios against a baseline measured in the same run, in alternating rounds; never fails on a time.
usage: python bench/bench_launcher.py [--repeat N] [--peer PATH_TO_0.0.7_TM] [--quick]

The previous generation installs a distribution of the same name and a ``tm`` script: give it its own virtualenv
(``python3 -m venv /work/peer && /work/peer/bin/pip install trainmeter==0.0.7``); ``--peer`` (default: TM_PEER_TM, else
/work/peer/bin/tm when it exists) points at its ``tm``, which runs ``python -c pass`` with the Python beside it (0.0.7's
agent loads only in its own environment), compared with that Python's own ``python -c pass``. Target (issue 16): tm
adds <= 0.2 s to ``python -c pass``, and never more than 0.0.7 does. The CPU seconds are the whole process tree's, each
process counted (``treecpu.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from treecpu import run_tree

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_B = os.sysconf("SC_PAGE_SIZE")
PACKAGES = ("trainmeter_core", "trainmeter_agent", "trainmeter_sources", "trainmeter_web")


def env_for(runs: Path) -> dict[str, str]:
    env = dict(os.environ, TM_RUNS_DIR=str(runs))
    for name in ("TM_ACTIVE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def load() -> str:
    """The machine's load, said with every figure: this bench is only as quiet as the machine it runs on."""
    with open("/proc/loadavg") as f:
        one, five, fifteen = f.read().split()[:3]
    return f"load average {one} {five} {fifteen} on {os.cpu_count()} cores"


def compiled() -> None:
    """Byte-compile the packages first: a checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile every
    module on every start, which an installed wheel never does (and 0.0.7, installed by pip, does not)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    targets = [str(REPO / name) for name in PACKAGES if (REPO / name).is_dir()]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *targets], env=env, check=False, stdout=subprocess.DEVNULL
    )


def timed(argv: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall seconds of one command; ``cpu`` gets the CPU seconds of its whole process tree (every process, one its
    parent left unwaited included: see ``treecpu.py``)."""
    done = run_tree(argv, env)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}: {done.stderr.strip()[-300:]}")
    if cpu is not None:
        cpu.append(done.cpu_s)
    return done.wall_s


def peer_python(peer: str) -> str | None:
    """0.0.7's own Python: the one beside its ``tm`` (its agent cannot load in another environment)."""
    for name in ("python", "python3"):
        candidate = Path(peer).parent / name
        if candidate.exists():
            return str(candidate)
    return None


def fixed_cost(repeat: int, env: dict[str, str], peer: str | None, quick: bool = False) -> None:
    """Rounds of plain, tm and 0.0.7 in turn, so drift in the machine's load hits all three alike."""
    names = ("plain", "tm", "0.0.7 plain", "0.0.7")
    runs: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    python = peer_python(peer) if peer else None
    if peer and python is None:
        print(f"no python beside {peer}: 0.0.7's column is left out")
    commands = {
        "plain": ([sys.executable, "-c", "pass"], env),
        "tm": ([TM, "-q", "--", sys.executable, "-c", "pass"], env),
    }
    if python:
        peer_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        commands["0.0.7 plain"] = ([python, "-c", "pass"], peer_env)
        commands["0.0.7"] = ([peer, "-q", "--", python, "-c", "pass"], peer_env)
    for _ in range(repeat):
        for name, (argv, run_env) in commands.items():
            runs[name].append(timed(argv, run_env, cpu[name]))
    plain = statistics.median(runs["plain"])
    tm_added = [u - p for u, p in zip(runs["tm"], runs["plain"], strict=True)]
    print(f"python -c pass:                median {plain * 1000:7.1f} ms over {repeat} rounds ({load()})")
    print(
        f"tm -- python -c pass:          median {statistics.median(runs['tm']) * 1000:7.1f} ms; tm adds "
        f"{statistics.median(tm_added) * 1000:6.1f} ms (median of paired rounds; quartiles "
        f"{_quartiles_ms(tm_added)}; target <= 200 ms)"
    )
    if runs["0.0.7"]:
        peer_added = [u - p for u, p in zip(runs["0.0.7"], runs["0.0.7 plain"], strict=True)]
        ratios = [t / q for t, q in zip(tm_added, peer_added, strict=True) if q > 0]
        print(
            f"0.0.7 tm -- python -c pass:    median {statistics.median(runs['0.0.7']) * 1000:7.1f} ms; 0.0.7 adds "
            f"{statistics.median(peer_added) * 1000:6.1f} ms over its own python -c pass "
            f"({statistics.median(runs['0.0.7 plain']) * 1000:.1f} ms; quartiles {_quartiles_ms(peer_added)})"
        )
        print(
            f"tm's added cost / 0.0.7's:     {statistics.median(ratios):.2f} (median of paired rounds; "
            "target < 1)"
        )
    cpu_plain = statistics.median(cpu["plain"])
    line = f"CPU seconds (all processes): python {cpu_plain * 1000:.0f} ms, tm adds {(statistics.median(cpu['tm']) - cpu_plain) * 1000:.0f} ms"
    if cpu["0.0.7"]:
        peer_cpu = statistics.median(cpu["0.0.7"]) - statistics.median(cpu["0.0.7 plain"])
        line += f", 0.0.7 adds {peer_cpu * 1000:.0f} ms (over its own python)"
    print(line + " (medians; CPU time is what a busy machine inflates least)")
    print(
        f"  reproduce: {sys.executable} bench/bench_launcher.py --repeat {repeat}"
        + (f" --peer {peer}" if peer else "")
        + (" --quick" if quick else "")
    )


def _quartiles_ms(values: list[float]) -> str:
    if len(values) < 4:
        return "n/a"
    q = statistics.quantiles(values, n=4)
    return f"{q[0] * 1000:.0f}-{q[2] * 1000:.0f} ms"


# The launcher with a mark at each step of a run: imported before tm's own code, it wraps the functions the launcher
# calls (by name, from outside), so the timeline costs tm nothing it would not pay anyway.
_TIMELINE = r"""
import json, os, sys, time
T0 = float(os.environ["TL_T0"])
marks = [("interpreter up (site, before tm's code)", time.time())]
def mark(name): marks.append((name, time.time()))
from trainmeter_core.commands import cli
mark("cli imported")
from trainmeter_core.run import launcher
mark("launcher imported (hub, zmq, msgspec, records, recorder)")
from trainmeter_core.bus import hub as hubm
from trainmeter_core.runlog import recorder as recm
from trainmeter_core.run import child as childm
def wrap(owner, name, label):
    original = getattr(owner, name)
    def wrapper(*a, **k):
        mark(label + " >")
        try:
            return original(*a, **k)
        finally:
            mark(label + " <")
    setattr(owner, name, wrapper)
for name in ("open_run", "describe_run", "write_agent_plugins", "start_components", "final_snapshot",
             "write_summary", "write_passport"):
    wrap(launcher, name, name)
for owner, names in ((childm.Child, ("start", "exited_within", "wait")), (hubm.Hub, ("start", "end", "stop")),
                     (recm.Recorder, ("start", "close"))):
    for name in names:
        wrap(owner, name, f"{owner.__name__}.{name}")
from trainmeter_core import plugins
wrap(plugins, "load", "plugins.load")
code = cli.main(sys.argv[1:])
mark("tm returns")
print(json.dumps([(n, (t - T0) * 1000) for n, t in marks]), file=sys.stderr)
sys.exit(code)
"""


def timeline(env: dict[str, str]) -> None:
    """One ``tm -- python -c pass`` with a mark at each step, from the moment the bench starts tm's interpreter."""
    env = dict(env, TL_T0=repr(time.time()))
    done = subprocess.run(
        [sys.executable, "-c", _TIMELINE, "-q", "--", sys.executable, "-c", "pass"],
        env=env,
        capture_output=True,
        text=True,
    )
    env["TL_T0"] = repr(time.time())
    done = subprocess.run(
        [sys.executable, "-c", _TIMELINE, "-q", "--", sys.executable, "-c", "pass"],
        env=env,
        capture_output=True,
        text=True,
    )
    try:
        marks = json.loads(done.stderr.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"timeline: failed: {done.stderr.strip()[-300:]}")
        return
    print(f"timeline of one tm -- python -c pass (ms from the bench starting tm's interpreter; {load()}):")
    previous = 0.0
    for name, at_ms in marks:
        print(f"  {at_ms:8.1f} ms  (+{at_ms - previous:6.1f})  {name}")
        previous = at_ms


def _import_rows(stderr: str) -> list[tuple[int, int, str]]:
    """(cumulative µs, depth, module) for each line ``-X importtime`` printed; depth 0 is a top-level import."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        rows.append((int(parts[1]), (len(name) - len(name.lstrip()) - 1) // 2, name.strip()))
    return rows


def import_times(env: dict[str, str], top: int = 8) -> None:
    """``-X importtime`` of each of tm's processes at start: the launcher, the components process (what it imports
    before its first record), and the agent in a Python child."""
    processes = {
        "launcher (tm -- python -c pass)": [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "trainmeter_core.commands.cli",
            "-q",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        "components process (host + built-ins)": [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import trainmeter_core.run.component_host as h; h.find_components(['engine', 'alerts', 'terminal'])",
        ],
    }
    for name, argv in processes.items():
        rows = _import_rows(subprocess.run(argv, env=env, capture_output=True, text=True).stderr)
        total_us = sum(us for us, depth, _ in rows if depth == 0)
        print(f"-X importtime, {name}: {total_us / 1000:.1f} ms of imports in all ({load()}); largest:")
        for us, _, module in sorted(rows, reverse=True)[:top]:
            print(f"    {us / 1000:7.1f} ms  {module}")
    # The child: the agent's bootstrap in a plain Python process (sitecustomize on PYTHONPATH, as tm starts it).
    boot = REPO / "trainmeter_agent" / "boot"
    child_env = dict(
        env,
        PYTHONPATH=os.pathsep.join([str(boot), str(REPO)]),
        TM_AGENT="1",
        TM_AGENT_ENDPOINT="ipc:///nonexistent/in",
    )
    rows = _import_rows(
        subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"], env=child_env, capture_output=True, text=True
        ).stderr
    )
    boot_us = sum(us for us, _, module in rows if module == "sitecustomize")  # site imports it; it the agent
    everything_us = sum(us for us, depth, _ in rows if depth == 0)
    print(
        f"-X importtime, the training process (python -c pass): the agent's bootstrap {boot_us / 1000:.1f} ms of "
        f"{everything_us / 1000:.1f} ms of imports (zmq and msgspec wait for the first record)"
    )


def to_child_start(repeat: int, env: dict[str, str]) -> None:
    # The child prints the wall time of its first line; the same script run plainly gives the interpreter's own share.
    code = "import time; print(time.time())"
    plain, under = [], []
    for _ in range(repeat):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
        plain.append(float(out) - t0)
        t0 = time.time()
        out = subprocess.run(
            [TM, "-q", "--", sys.executable, "-c", code], env=env, capture_output=True, text=True
        ).stdout
        under.append(float(out.split()[0]) - t0)
    p, u = statistics.median(plain), statistics.median(under)
    print(
        f"start -> child's first line: plain {p * 1000:6.1f} ms, under tm {u * 1000:6.1f} ms "
        f"(tm's share {(u - p) * 1000:.1f} ms; target <= 150 ms)"
    )


def tree(root: int) -> list[int]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = open(f"/proc/{entry}/stat", "rb").read()
            except OSError:
                continue
            stats[int(entry)] = int(data[data.rfind(b")") + 2 :].split()[1])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(p for p, ppid in stats.items() if ppid == pid)
    return out


def cpu_s(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_b(pid: int) -> int:
    try:
        return int(open(f"/proc/{pid}/statm").read().split()[1]) * PAGE_B
    except OSError:
        return 0


def idle_cost(env: dict[str, str], window_s: float = 10.0) -> None:
    proc = subprocess.Popen([TM, "-q", "--", sys.executable, "-c", "import time; time.sleep(40)"], env=env)
    time.sleep(3.0)  # let the components start and settle
    child = [p for p in tree(proc.pid) if p != proc.pid and "time.sleep" in open(f"/proc/{p}/cmdline").read()]
    child_tree = set(tree(child[0])) if child else set()
    ours = [p for p in tree(proc.pid) if p not in child_tree]
    before = {p: cpu_s(p) for p in ours}
    time.sleep(window_s)
    used = sum(cpu_s(p) - before[p] for p in ours)
    rss = sum(rss_b(p) for p in ours)
    print(
        f"idle run: tm's {len(ours)} processes use {used / window_s * 100:.2f}% of a core and {rss / 2**20:.1f} MiB RSS "
        "(targets <= 3%, <= 150 MB)"
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait()


def restart_time(env: dict[str, str], runs: Path) -> None:
    env = dict(env, TM_HOST_INTERVAL_S="0.1")
    proc = subprocess.Popen([TM, "-q", "--", sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    deadline = time.monotonic() + 20

    def records():
        out = []
        for seg in sorted(runs.glob("*/events-*.jsonl")):
            for line in seg.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    pid = None
    while pid is None and time.monotonic() < deadline:
        started = [r for r in records() if r["kind"] == "component" and r["event"] == "started"]
        if started and any(r["kind"] == "sample.host" for r in records()):
            pid = started[0]["child_pid"]
        time.sleep(0.05)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    restarted_at = sample_at = None
    while time.monotonic() < deadline and sample_at is None:
        recs = records()
        again = [r for r in recs if r["kind"] == "component" and r["event"] == "restarted"]
        if again and restarted_at is None:
            restarted_at = time.monotonic()
        if again and any(r["kind"] == "sample.host" and r["seq"] > again[0]["seq"] for r in recs):
            sample_at = time.monotonic()
        time.sleep(0.01)
    print(
        f"kill -9 of the components process: restarted record after {(restarted_at - killed) * 1000:.0f} ms, "
        f"first host sample after {(sample_at - killed) * 1000:.0f} ms (includes the 0.2 s first backoff)"
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--peer", default=os.environ.get("TM_PEER_TM") or None)
    parser.add_argument("--quick", action="store_true", help="the fixed cost, its timeline and imports only")
    args = parser.parse_args()
    peer = args.peer or ("/work/peer/bin/tm" if os.path.exists("/work/peer/bin/tm") else None)
    if peer is None:
        print("trainmeter 0.0.7 not found (--peer PATH): its column is left out")
    compiled()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        env = env_for(runs)
        fixed_cost(args.repeat, env, peer, args.quick)
        timeline(env)
        import_times(env)
        if args.quick:
            return
        to_child_start(args.repeat, env)
        idle_cost(env)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        restart_time(env_for(runs), runs)


if __name__ == "__main__":
    main()
