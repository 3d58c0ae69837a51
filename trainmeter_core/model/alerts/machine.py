"""Alert rules about the machine: GPU throttling, Xid and uncorrectable ECC errors, a GPU off the bus, paid GPUs the run
holds sitting idle, a disk or the host memory nearly full.

Pure functions of a rule's state and one snapshot: no clock, no I/O. One subject per GPU (``<host>/gpu<index>``) or per
filesystem role (``run``, ``checkpoints``, ``shm``). A reading the sampler could not take is absent and trips nothing.
"""

from __future__ import annotations

from trainmeter_core.model import records
from trainmeter_core.model.alerts.episodes import Condition, Rule, RuleState, Verdict, metric

# What some Xids mean, in the words of NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/, "Xid Error
# Listing"); any other code is named by its number alone.
XID_MEANINGS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "double bit ECC error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


def _per_gpu(snapshot: records.Snapshot, prefix: str) -> dict[str, float | None]:
    """GPU key -> value of every ``<prefix>.<host>/gpu<i>`` metric of the snapshot."""
    found: dict[str, float | None] = {}
    for key, value in snapshot.metrics.items():
        if key.startswith(prefix + "."):
            found[key[len(prefix) + 1 :]] = value.value
    return found


class GpuThrottle(Rule):
    """A GPU slowed for heat (sw/hw thermal, hw slowdown) or, with ``power`` 1, for power (power cap, power brake),
    sustained for ``fire_after_s``. Power-only throttling is severity info: a GPU at its power limit under a full
    load is common; heat is a warning."""

    name = "gpu_throttle"
    severity = "warning"
    defaults = {"power": 1.0, "fire_after_s": 60.0, "clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        power = _per_gpu(snapshot, "gpu_power_throttle")
        thermal = _per_gpu(snapshot, "gpu_thermal_throttle")
        verdict = Verdict()
        for key in sorted(set(power) | set(thermal)):
            hot = thermal.get(key) == 1.0
            capped = power.get(key) == 1.0 and bool(state.config["power"])
            numbers = {"thermal": 1.0 if hot else 0.0, "power": 1.0 if capped else 0.0}
            if not (hot or capped):
                verdict.normal.append(Condition(f"{key} runs at full clocks again", numbers, key))
                continue
            labels: list[str] = []
            for kind, on in (("gpu_thermal_throttle", hot), ("gpu_power_throttle", capped)):
                if on:
                    labels.extend((snapshot.metrics[f"{kind}.{key}"].label or "").split(","))
            what = "heat and power" if hot and capped else ("heat" if hot else "power")
            message = f"{key} throttles for {what} ({', '.join(dict.fromkeys(x for x in labels if x))})"
            verdict.active.append(Condition(message, numbers, key, None if hot else "info"))
        return verdict


class GpuXid(Rule):
    """A GPU reported an Xid event (a driver-reported error). Clears after ``clear_after_s`` without a new one."""

    name = "gpu_xid"
    severity = "critical"
    defaults = {"clear_after_s": 300.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        seen: dict[str, float] = state.memory.setdefault("counts", {})
        verdict = Verdict()
        for key, count in sorted(_per_gpu(snapshot, "gpu_xid").items()):
            if count is None:
                continue
            new = count - seen.get(key, 0.0)
            seen[key] = count
            last = metric(snapshot, f"gpu_xid_last.{key}")
            numbers = {"xid_events": count, "new_xid_events": new}
            if last is not None:
                numbers["xid"] = last
            if new > 0 and last is not None:
                meaning = XID_MEANINGS.get(int(last))
                named = f"Xid {last:.0f}" + (f" ({meaning})" if meaning else "")
                more = f", {new:.0f} events since the previous check" if new > 1 else ""
                verdict.active.append(Condition(f"{key} reported {named}{more}", numbers, key))
            else:
                verdict.normal.append(Condition(f"{key}: no new Xid", numbers, key))
        return verdict


class GpuEcc(Rule):
    """A GPU's volatile uncorrectable ECC error count is above zero (it only falls when the driver reloads)."""

    name = "gpu_ecc"
    severity = "critical"
    defaults = {"clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        verdict = Verdict()
        for key, count in sorted(_per_gpu(snapshot, "gpu_ecc_uncorrected").items()):
            if count is None:
                continue
            numbers = {"ecc_uncorrected": count}
            if count > 0:
                message = f"{key} reports {count:.0f} uncorrectable ECC errors (volatile count since the driver loaded)"
                verdict.active.append(Condition(message, numbers, key))
            else:
                verdict.normal.append(Condition(f"{key}: no uncorrectable ECC error", numbers, key))
        return verdict


class GpuLost(Rule):
    """NVML says a GPU is lost: it fell off the bus. Clears when NVML answers for it again."""

    name = "gpu_lost"
    severity = "critical"
    defaults = {"clear_after_s": 30.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        verdict = Verdict()
        for key, lost in sorted(_per_gpu(snapshot, "gpu_lost").items()):
            if lost == 1.0:
                message = f"{key} is lost: NVML no longer answers for it (fallen off the bus)"
                verdict.active.append(Condition(message, {"lost": 1.0}, key))
            elif lost is not None:
                verdict.normal.append(Condition(f"{key} answers again", {"lost": 0.0}, key))
        return verdict


class GpuIdle(Rule):
    """A GPU the run holds sits idle while the training process lives: its GPU-Util below ``max_util`` for
    ``fire_after_s`` (paid GPU time with nothing to show). One subject per GPU; clears once it works again or the run
    ends. GPUs watched only for the hardware view are not the run's and never trip it."""

    name = "gpu_idle"
    severity = "warning"
    defaults = {"max_util": 0.05, "fire_after_s": 600.0, "clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        verdict = Verdict()
        alive = metric(snapshot, "child_alive") == 1.0
        for key, util in sorted(_per_gpu(snapshot, "held_util_gpu").items()):
            if util is None:
                continue
            numbers = {"util_gpu": util, "max_util": state.config["max_util"]}
            if alive and util < state.config["max_util"]:
                message = (
                    f"{key} sits idle while the run holds it: GPU-Util {util:.0%}, below "
                    f"{state.config['max_util']:.0%} (paid time with nothing to show)"
                )
                verdict.active.append(Condition(message, numbers, key))
            else:
                verdict.normal.append(Condition(f"{key} works again: GPU-Util {util:.0%}", numbers, key))
        return verdict


class NodeLost(Rule):
    """A node of a job of several nodes fell silent: the job hub heard nothing from it for longer than its heartbeat
    timeout (its tm died, its machine did, or the network between them is down; the hub cannot tell which). One
    subject per node (its host name); clears when the node is heard from again."""

    name = "node_lost"
    severity = "critical"
    defaults = {"clear_after_s": 30.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        verdict = Verdict()
        for node in snapshot.nodes:
            if node.state == "ended" or node.node_rank == (snapshot.job.node_rank if snapshot.job else 0):
                continue
            numbers = {"node_rank": float(node.node_rank)}
            if node.silent_s is not None:
                numbers["silent_s"] = node.silent_s
            if node.state == "lost":
                last = f"a {node.last_kind} record" if node.last_kind else "no record at all"
                silent = f" for {node.silent_s:.0f} s" if node.silent_s is not None else ""
                message = (
                    f"node {node.node_rank} ({node.host}) is lost: the job hub has heard nothing from it{silent}; "
                    f"the last it had was {last}"
                )
                verdict.active.append(Condition(message, numbers, node.host))
            else:
                verdict.normal.append(
                    Condition(f"node {node.node_rank} ({node.host}) is heard again", numbers, node.host)
                )
        return verdict


class DiskFull(Rule):
    """The filesystem holding the run directory, the checkpoints or /dev/shm has less than ``min_free`` of it free."""

    name = "disk_full"
    severity = "warning"
    defaults = {"min_free": 0.05, "clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        verdict = Verdict()
        for role in ("run", "checkpoints", "shm"):
            free = metric(snapshot, f"disk_free.{role}")
            avail_b = metric(snapshot, f"disk_avail_b.{role}")
            if free is None:
                continue
            numbers = {"free": free}
            if avail_b is not None:
                numbers["avail_b"] = avail_b
            path = snapshot.metrics[f"disk_free.{role}"].label or role
            left = f", {_bytes(avail_b)} left" if avail_b is not None else ""
            if free < state.config["min_free"]:
                message = f"the filesystem holding {role} ({path}) is {1 - free:.1%} full{left}"
                verdict.active.append(Condition(message, numbers, role))
            else:
                verdict.normal.append(Condition(f"{path} has {free:.1%} free{left}", numbers, role))
        return verdict


class HostMemory(Rule):
    """Host memory nearly exhausted: less than ``min_available`` of it available (of the cgroup's limit where that is
    tighter)."""

    name = "host_memory"
    severity = "warning"
    defaults = {"min_available": 0.05, "clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        free = metric(snapshot, "node_mem_available")
        if free is None:
            return Verdict()
        scope = snapshot.metrics["node_mem_available"].label or "node"
        numbers = {"available": free}
        avail_b = metric(snapshot, "node_mem_available_b")
        if avail_b is not None:
            numbers["available_b"] = avail_b
        if free < state.config["min_available"]:
            message = f"host memory nearly exhausted: {free:.1%} available ({scope})"
            return Verdict(active=[Condition(message, numbers)])
        return Verdict(normal=[Condition(f"{free:.1%} of host memory available ({scope})", numbers)])


def _bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"
