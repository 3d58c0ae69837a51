"""Nodes on one machine for the multi-node tests: each node a network namespace of its own, run under its own UTS and
time namespace (its own host name and its own monotonic clock offset), with two links through a switch namespace:
``t0`` for tm's traffic (the job hub's address is node 0's) and ``d0`` for the training's (gloo), so one node's tm link
can go down while the job trains on.

Root only (CI runs as root): ``ip`` from iproute2 and ``unshare`` from util-linux. Every address lives inside
namespaces the test made, and ``close`` deletes them all.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

TM_NET = "10.77.0"
DDP_NET = "10.78.0"


def require_namespaces() -> None:
    """Root, ip and unshare, or a failure under TM_REQUIRE_NAMESPACES=1 (CI: it runs as root, and
    ./scripts/setup-netns installs iproute2), else a skip that says why."""
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    why = None
    if os.geteuid() != 0:
        why = "network namespaces need root"
    elif missing:
        why = f"{' and '.join(missing)} not installed (apt-get install iproute2 util-linux)"
    if why is None:
        return
    if os.environ.get("TM_REQUIRE_NAMESPACES") == "1":
        pytest.fail(f"the multi-node tests must run here: {why}")
    pytest.skip(why)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Nodes:
    """``n`` nodes named node0..node<n-1>; node k's tm address is 10.77.0.<k+1>, its training address 10.78.0.<k+1>."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tag = secrets.token_hex(2)
        self.switch = f"tm{self.tag}sw"
        self.names = [f"tm{self.tag}n{k}" for k in range(n)]
        self.made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for name in [self.switch, *self.names]:
            _ip("netns", "add", name)
            self.made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        for bridge in ("swt", "swd"):
            _ip("-n", self.switch, "link", "add", bridge, "type", "bridge")
            _ip("-n", self.switch, "link", "set", bridge, "up")
        for k, name in enumerate(self.names):
            for net, bridge, subnet in (("t", "swt", TM_NET), ("d", "swd", DDP_NET)):
                inside, outside = f"{self.tag}{net}{k}a", f"{self.tag}{net}{k}b"
                _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
                _ip("link", "set", inside, "netns", name)
                _ip("link", "set", outside, "netns", self.switch)
                _ip("-n", name, "link", "set", inside, "name", f"{net}0")
                _ip("-n", name, "addr", "add", f"{subnet}.{k + 1}/24", "dev", f"{net}0")
                _ip("-n", name, "link", "set", f"{net}0", "up")
                _ip("-n", self.switch, "link", "set", outside, "master", bridge)
                _ip("-n", self.switch, "link", "set", outside, "up")

    def tm_address(self, k: int) -> str:
        return f"{TM_NET}.{k + 1}"

    def free_port(self, k: int) -> int:
        """A port free inside node k's namespace, with the one above it free too (the job hub's, by derivation)."""
        code = (
            "import socket\n"
            "for _ in range(100):\n"
            "    s = socket.socket(); s.bind(('', 0)); p = s.getsockname()[1]\n"
            "    t = socket.socket()\n"
            "    try:\n"
            "        t.bind(('', p + 1)); print(p); break\n"
            "    except OSError: pass\n"
            "    finally: t.close(); s.close()\n"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", self.names[k], "python3", "-c", code],
            check=True,
            capture_output=True,
            text=True,
        )
        return int(done.stdout.strip())

    def link(self, k: int, up: bool) -> None:
        """Take node k's tm link down or up (its training link stays)."""
        _ip("-n", self.names[k], "link", "set", "t0", "up" if up else "down")

    def command(self, k: int, argv: list[str], monotonic_offset_s: int) -> list[str]:
        """``argv`` run as node k: in its network namespace, with host name ``node<k>`` and its own monotonic clock."""
        return [
            "ip",
            "netns",
            "exec",
            self.names[k],
            "unshare",
            "--uts",
            "--time",
            f"--monotonic={monotonic_offset_s}",
            "--fork",
            "--",
            "sh",
            "-c",
            f'hostname node{k} && exec "$@"',
            "sh",
            *argv,
        ]

    def close(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.made.clear()


def descendants(root: int) -> set[int]:
    """``root`` and every process below it, from /proc."""
    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    pids = {root}
    while True:
        more = {pid for pid, ppid in parents.items() if ppid in pids} - pids
        if not more:
            return pids
        pids |= more


def launcher_pid(runs: Path) -> int | None:
    """The pid of the tm launcher of the run under ``runs`` (from its meta.json), once it wrote one."""
    import json

    for meta in runs.glob("*/meta.json"):
        try:
            return int(json.loads(meta.read_text())["launcher_pid"])
        except (ValueError, KeyError, OSError):
            return None
    return None
