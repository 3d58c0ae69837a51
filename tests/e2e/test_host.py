"""The host sampler: the run's process tree (walked again only when a process was born), CPU cores, memory and I/O
from /proc, and the node's CPU split, memory, cgroup limits, disks, network and filesystems."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from deadline import wait_for
from tm_runs import log_records, only_run, run_tm

from trainmeter_core.bus.proctree import CLOCK_TICKS, PAGE_B, ProcessTree
from trainmeter_core.model.platform_adapters import FIRST_SAMPLE
from trainmeter_sources.host_sampler import CHECKPOINT_FOLDERS_FACT, TreeSampler
from trainmeter_sources.node import NodeReader, cgroup_limits


def write_proc(proc, pid, name, ppid, utime, stime, threads=1, rss_pages=100, io=(0, 0), children=()):
    """One process in a fake /proc, laid out as the kernel's (only the fields tm reads are meaningful)."""
    base = proc / str(pid)
    (base / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", ppid, 0, 0, 0, 0, 0, 0, 0, 0, 0, utime, stime, 0, 0, 20, 0, threads, 0, 12345]
    (base / "stat").write_text(f"{pid} ({name}) " + " ".join(map(str, fields)) + "\n")
    (base / "statm").write_text(f"1000 {rss_pages} 50 1 0 200 0\n")
    (base / "io").write_text(f"rchar: 1\nwchar: 1\nread_bytes: {io[0]}\nwrite_bytes: {io[1]}\n")
    (base / "task" / str(pid) / "children").write_text(
        " ".join(map(str, children)) + (" " if children else "")
    )


def test_a_stable_tree_is_not_walked_again(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 100, "python", 1, 0, 0, children=[101])
    write_proc(proc, 101, "worker", 100, 0, 0)
    newest = [500]
    tree = ProcessTree(100, str(proc), last_pid_reader=lambda: newest[0])
    assert set(tree.refresh()) == {100, 101} and tree.walks == 1
    for _ in range(5):
        tree.refresh()
    assert tree.walks == 1  # no process was born anywhere: one stat read per known process, no walk
    write_proc(proc, 102, "worker", 100, 0, 0)
    write_proc(proc, 100, "python", 1, 0, 0, children=[101, 102])
    newest[0] = 502
    assert set(tree.refresh()) == {100, 101, 102} and tree.walks == 2


def test_cpu_cores_rss_and_io_are_rates_over_the_window(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 100, "python", 1, 1 * CLOCK_TICKS, 0, threads=3, rss_pages=10, io=(0, 0), children=[101])
    write_proc(proc, 101, "worker", 100, 0, 0, threads=1, rss_pages=5, io=(0, 0))
    sampler = TreeSampler(100, ProcessTree(100, str(proc), last_pid_reader=lambda: 7))
    first = sampler.sample(10.0)
    assert first.absent["cpu_cores"] == FIRST_SAMPLE and first.cpu_cores is None
    assert (first.procs, first.threads, first.rss_b) == (2, 4, 15 * PAGE_B)
    # 2 s later: python used 1 -> 3 CPU s (+2), the worker 0 -> 0.5 s; (2 + 0.5) / 2 s = 1.25 cores busy
    write_proc(
        proc, 100, "python", 1, 3 * CLOCK_TICKS, 0, threads=3, rss_pages=10, io=(4096, 0), children=[101]
    )
    write_proc(proc, 101, "worker", 100, CLOCK_TICKS // 2, 0, threads=1, rss_pages=5, io=(0, 2048))
    second = sampler.sample(12.0)
    assert second.cpu_cores == pytest.approx(1.25) and second.window_s == pytest.approx(2.0)
    assert second.io_read_bps == pytest.approx(2048) and second.io_write_bps == pytest.approx(
        1024
    )  # bytes / 2 s
    assert [p.pid for p in second.top] == [100, 101] and second.top[0].cpu_cores == pytest.approx(1.0)


def test_a_process_on_its_way_out_reads_no_memory_and_the_sample_says_so_instead_of_zero(tmp_path):
    # Read between its stat and its statm, a process that exited (or is exiting) has let its pages go: its statm reads
    # zeros. It adds nothing to the tree's memory, and a tree of such processes has its memory absent, with why.
    proc = tmp_path / "proc"
    write_proc(proc, 100, "python", 1, 0, 0, rss_pages=10, children=[101])
    write_proc(proc, 101, "worker", 100, 0, 0, rss_pages=0)
    sampler = TreeSampler(100, ProcessTree(100, str(proc), last_pid_reader=lambda: 7))
    first = sampler.sample(1.0)
    assert first.rss_b == 10 * PAGE_B and "rss_b" not in first.absent
    assert {p.pid: p.rss_b for p in first.top} == {100: 10 * PAGE_B, 101: None}
    write_proc(proc, 100, "python", 1, 0, 0, rss_pages=0, children=[101])
    second = sampler.sample(2.0)
    assert second.rss_b is None and "exiting" in second.absent["rss_b"]


def test_a_tree_whose_processes_are_gone_gives_no_record(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    assert TreeSampler(100, ProcessTree(100, str(proc), last_pid_reader=lambda: 1)).sample(1.0) is None


def test_a_real_child_tree_is_found_through_the_children_files():
    child = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        tree = ProcessTree(child.pid)

        def whole_tree():
            stats = tree.refresh()
            # bash forks before each sleep execs: a child is named "bash" for a moment, so wait for the names too
            names = sorted(s.name for s in stats.values())
            return stats if names == ["bash", "sleep", "sleep"] else None

        stats = wait_for(whole_tree, what="bash and two sleeps")
        assert sorted(s.name for s in stats.values()) == ["bash", "sleep", "sleep"]
    finally:
        child.kill()
        child.wait()


def write_node(tmp_path, cpu, disk_sectors, net_bytes):
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + " 0 0\ncpu0 1 2 3\n")
    (proc / "loadavg").write_text("0.50 1.00 1.50 2/300 4242\n")
    (proc / "meminfo").write_text(
        "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 600 kB\nSwapTotal: 200 kB\nSwapFree: 150 kB\n"
    )
    read, written, io_ms = disk_sectors
    (proc / "diskstats").write_text(
        f" 253 0 vda 0 0 {read} 0 0 0 {written} 0 0 {io_ms} 0 0 0 0 0 0\n 7 0 loop0 0 0 999 0 0 0 0 0 0 0 0\n"
    )
    rx, tx = net_bytes
    (proc / "net" / "dev").write_text(
        "Inter-| Receive\n face |bytes\n    lo: 5 0 0 0 0 0 0 0 5 0 0 0 0 0 0 0\n"
        f"  eth0: {rx} 0 0 0 0 0 0 0 {tx} 0 0 0 0 0 0 0\n"
    )
    (proc / "self").mkdir(exist_ok=True)
    (proc / "self" / "cgroup").write_text("0::/job\n")
    block = tmp_path / "block"
    for name in ("vda", "loop0"):
        (block / name).mkdir(parents=True, exist_ok=True)
    cgroup = tmp_path / "cgroup"
    (cgroup / "job").mkdir(parents=True, exist_ok=True)
    (cgroup / "cgroup.controllers").write_text("cpu memory\n")
    (cgroup / "job" / "cpu.max").write_text("250000 100000\n")
    (cgroup / "job" / "memory.max").write_text("max\n")
    (cgroup / "job" / "memory.current").write_text("4096\n")
    return NodeReader(str(proc), str(block), str(cgroup))


def test_the_node_splits_cpu_time_and_turns_counters_into_rates(tmp_path):
    # user nice system idle iowait irq softirq steal
    reader = write_node(tmp_path, [1000, 0, 500, 8000, 300, 100, 100, 0], (0, 0, 0), (0, 0))
    first = reader.read(5.0, {"run": [str(tmp_path)], "shm": ["/dev/shm"]})
    assert (
        first.absent["cpu_user"] == FIRST_SAMPLE and first.disks == [] and first.absent["net"] == FIRST_SAMPLE
    )
    write_node(tmp_path, [1100, 0, 550, 8800, 330, 110, 110, 0], (2048, 1024, 500), (3000, 1000))
    node = reader.read(7.0, {"run": [str(tmp_path)], "shm": ["/dev/shm"]})
    # deltas: user 100, system 50 + irq 10 + softirq 10 = 70, idle 800, iowait 30, steal 0; total 1000 ticks
    assert (node.cpu_user, node.cpu_system, node.cpu_idle) == pytest.approx((0.10, 0.07, 0.80))
    assert (node.cpu_iowait, node.cpu_steal) == pytest.approx((0.03, 0.0))
    (disk,) = node.disks  # loop devices are not disks
    # 2048 sectors x 512 B / 2 s = 524288 B/s read; 1024 x 512 / 2 = 262144 B/s written; 500 ms busy / 2 s = 0.25
    assert (disk.device, disk.read_bps, disk.write_bps, disk.busy) == ("vda", 524288, 262144, 0.25)
    (net,) = node.net  # lo is left out
    assert (net.interface, net.rx_bps, net.tx_bps) == ("eth0", 1500, 500)
    assert (node.mem_total_b, node.mem_available_b) == (1000 * 1024, 600 * 1024)
    assert (node.swap_total_b, node.swap_used_b) == (200 * 1024, 50 * 1024)
    assert (node.load1, node.load15) == (0.5, 1.5)
    assert node.cgroup_cpu_quota_cores == 2.5  # 250000 us per 100000 us period
    assert node.cgroup_mem_limit_b is None and node.absent["cgroup_mem_limit_b"] == "no cgroup memory limit"
    assert node.cgroup_mem_used_b == 4096
    roles = {fs.role for fs in node.filesystems}
    assert roles == {"run", "shm"} and all(fs.total_b and fs.avail_b is not None for fs in node.filesystems)


def test_cgroup_v1_quota_and_an_unlimited_memory_limit(tmp_path):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("4:memory:/a\n2:cpu,cpuacct:/a\n")
    for controller, files in {
        "cpu": {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"},
        "memory": {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "123"},
    }.items():
        (root / controller / "a").mkdir(parents=True)
        for name, text in files.items():
            (root / controller / "a" / name).write_text(text + "\n")
    limits = cgroup_limits("self", str(proc), str(root))
    assert limits["absent"] == {
        "cgroup_cpu_quota_cores": "no cgroup CPU quota",
        "cgroup_mem_limit_b": "no cgroup memory limit",
    }
    assert limits["cgroup_mem_used_b"] == 123


@pytest.mark.xdist_group("heavy")
def test_a_run_records_its_process_tree_and_the_node(tm_env, tmp_path):
    busy = "import time\nt = time.time()\nwhile time.time() - t < 3: sum(range(1000))\n"
    env = dict(tm_env, TM_HOST_INTERVAL_S="0.2")
    result = run_tm(["--no-agent", "--", sys.executable, "-c", busy], env)
    assert result.returncode == 0, result.stderr
    records = log_records(only_run(tmp_path / "runs"))
    start = next(r for r in records if r["kind"] == "run.start")
    hosts = [r for r in records if r["kind"] == "sample.host" and "cpu_cores" in r]
    assert hosts and all(r["root_pid"] == start["child_pid"] for r in hosts)
    assert max(r["cpu_cores"] for r in hosts) > 0.2 and all(r["rss_b"] > 0 for r in hosts[:-1])
    # The last may meet the process on its way out, its memory let go (CI once read 0 there): then it says so
    last = hosts[-1]
    assert last.get("rss_b", 0) > 0 or "exiting" in last["absent"]["rss_b"], last
    nodes = [r for r in records if r["kind"] == "sample.node" and "cpu_user" in r]
    assert nodes and nodes[-1]["mem_total_b"] > 0 and nodes[-1]["cpu_count"] == os.cpu_count()
    assert {fs["role"] for fs in nodes[-1]["filesystems"]} >= {"run", "shm"}


@pytest.mark.xdist_group("heavy")
def test_the_filesystem_of_a_checkpoint_folder_is_watched_once_the_training_saves_there(
    tm_env, tmp_path, torch
):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    # One optimizer step first: a process that never trains never says hello, and its agent stays silent.
    save = (
        "import sys, time, torch\n"
        "model = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "optimizer.step()\n"
        "torch.save(model.state_dict(), sys.argv[1])\n"
        "time.sleep(2)\n"
    )
    env = dict(tm_env, TM_HOST_INTERVAL_S="0.2")
    result = run_tm(["--", sys.executable, "-c", save, str(folder / "model.pt")], env)
    assert result.returncode == 0, result.stderr
    records = log_records(only_run(tmp_path / "runs"))
    said = [r for r in records if r["kind"] == "fact" and r["name"] == CHECKPOINT_FOLDERS_FACT]
    assert [r["value"] for r in said] == [[str(folder)]]
    watched = [
        fs
        for r in records
        if r["kind"] == "sample.node" and r["seq"] > said[0]["seq"]
        for fs in r.get("filesystems", [])
        if fs["role"] == "checkpoints"
    ]
    assert watched and {fs["path"] for fs in watched} == {str(folder)}
    assert all(fs["total_b"] > 0 for fs in watched)


class _BeatContext:
    """What the host sampler uses of its ComponentContext: the messages it publishes, and a stop after a beat."""

    def __init__(self, run_dir) -> None:
        import threading

        self.child_pid = os.getpid()
        self.run_dir = run_dir
        self.stopping = threading.Event()
        self.messages: list[list] = []

    def publish(self, record) -> bool:
        return self.publish_many([record])

    def publish_many(self, batch) -> bool:
        self.messages.append(list(batch))
        if any(type(record).__name__ == "SampleNode" for record in batch):
            self.stopping.set()  # the beat's last record
        return True

    def recv(self, timeout_s: float):
        return None


def test_a_beats_tree_and_node_samples_leave_as_one_message(tmp_path):
    # One wake of the hub a second for both, not two (docs/performance.md, "Windows of a second")
    from trainmeter_core.model import records
    from trainmeter_sources.host_sampler import HostSampler

    ctx = _BeatContext(tmp_path)
    HostSampler().run(ctx)
    ((tree, node),) = ctx.messages
    assert type(tree) is records.SampleHost and tree.root_pid == os.getpid()
    assert type(node) is records.SampleNode and node.t == tree.t
