"""Files a sampler reads on every beat, kept open and read again from their start (``proctree.KeptFiles``): what a
read sees after the file changes, goes, or comes back; the files of a process closed once it leaves the tree; a
filesystem's mount point looked up once while statvfs names the same filesystem."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from trainmeter_core.bus.proctree import KeptFiles, ProcessTree
from trainmeter_sources import node
from trainmeter_sources.host_sampler import TreeSampler


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_kept_file_reads_what_it_holds_now_and_one_that_went_reads_none_until_it_comes_back(tmp_path):
    files = KeptFiles()
    path = tmp_path / "counter"
    assert files.read(str(path)) is None  # not there yet: nothing kept
    path.write_text("1 2 3\n")
    before = open_fds()
    assert files.read(str(path)) == b"1 2 3\n"
    assert open_fds() == before + 1
    path.write_text("4\n")  # rewritten in place, shorter: the read from its start sees only the new contents
    assert files.read(str(path)) == b"4\n" and open_fds() == before + 1
    big = b"x" * 200_000  # more than one pread's worth
    path.write_bytes(big)
    assert files.read(str(path)) == big
    files.close()
    assert open_fds() == before


def test_a_missing_file_read_with_retry_s_is_looked_for_again_only_after_that(tmp_path):
    files = KeptFiles()
    path = tmp_path / "cpu.max"
    assert files.read(str(path), retry_s=0.3) is None
    path.write_text("max 100000\n")
    assert files.read(str(path), retry_s=0.3) is None  # not looked for again so soon
    time.sleep(0.35)
    assert files.read(str(path), retry_s=0.3) == b"max 100000\n"
    files.close()


def test_a_processs_kept_files_read_none_once_it_is_gone_and_its_files_are_closed_when_it_leaves_the_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    files = KeptFiles()
    try:
        before = open_fds()
        tree = ProcessTree(child.pid, files=files)
        sampler = TreeSampler(child.pid, tree)
        for t in (1.0, 2.0, 3.0):
            record = sampler.sample(t)
            assert record is not None and record.procs == 1 and record.rss_b > 0
        assert (
            open_fds() == before + 4
        )  # its stat, statm and io, and /proc/loadavg: opened once, read three times
        child.kill()
        child.wait()
        assert (
            files.read(f"/proc/{child.pid}/stat", child.pid) is None
        )  # the fd names the process, not the pid
        assert sampler.sample(4.0) is None
        assert open_fds() == before + 1  # /proc/loadavg alone
    finally:
        child.kill()
        child.wait()
        files.close()


def test_a_filesystems_mount_point_is_looked_up_once_while_it_stays_the_same(tmp_path, monkeypatch):
    found = []
    real = node.mount_of
    monkeypatch.setattr(node, "mount_of", lambda path: found.append(path) or real(path))
    mounts: dict = {}
    stats = [node.filesystem("run", str(tmp_path), mounts) for _ in range(5)]
    assert found == [str(tmp_path)] and len({s.mount for s in stats}) == 1 and stats[0].mount is not None
    fsid, mount, at = mounts[str(tmp_path)]
    mounts[str(tmp_path)] = (fsid, mount, at - node.MOUNT_KEPT_S)  # a minute later: looked up again
    node.filesystem("run", str(tmp_path), mounts)
    mounts[str(tmp_path)] = (fsid + 1, mount, time.monotonic())  # another filesystem at that path: at once
    node.filesystem("run", str(tmp_path), mounts)
    assert found == [str(tmp_path)] * 3
