"""The communication families on /metrics (issue 43): each rank's exposed collective wait, data wait and compute per
step, its bus bandwidth per operation kind, and the straggler with its host and cause. Pure, as ``families``: a number
the snapshot holds as absent is left out, never written as 0."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from trainmeter_core.api import MetricValue, Snapshot
from trainmeter_prometheus.identity import Identity


def _known(snapshot: Snapshot, key: str) -> MetricValue | None:
    value = snapshot.metrics.get(key)
    return None if value is None or value.absent is not None else value


def _device(key: str | None, host: str) -> str:
    """``<host>/gpu0`` -> ``gpu0``, as the rank families label a device (the node is a label of its own)."""
    if not key:
        return ""
    return key[len(host) + 1 :] if host and key.startswith(host + "/") else key


#: A rank's bus bandwidth: ``bus_bandwidth_bps.<op>.<group size>.rank<k>``.
BUS_BANDWIDTH = "bus_bandwidth_bps."


def families(snapshot: Snapshot, who: Identity, run_labels: list[str]) -> Iterator[Metric]:
    """Each rank's exposed collective wait, data wait and compute per step, its bus bandwidth per operation kind, and
    the straggler (the rank that makes the others wait, its host and cause): absent numbers left out."""
    labels = [*run_labels, "rank", "device"]
    per_step = [
        ("collective_wait_s", "trainmeter_rank_collective_wait_seconds",
         "EMA per step of the rank's exposed wait in collectives (not overlapped with compute)."),
        ("data_wait_s", "trainmeter_rank_data_wait_seconds", "EMA per step of the rank's data wait."),
        ("compute_s", "trainmeter_rank_compute_seconds",
         "The rank's step time less its collective wait and data wait, per step."),
    ]  # fmt: skip
    out: list[Metric] = []
    hosts: dict[int, str] = {}
    for field, name, help_text in per_step:
        family = GaugeMetricFamily(name, help_text, labels=labels, unit="seconds")
        for rank in snapshot.ranks:
            hosts[rank.rank] = rank.host
            value = getattr(rank, field)
            if value is not None:
                node = who.node_of(rank.host)
                family.add_metric([who.job, node, str(rank.rank), _device(rank.device, rank.host)], value)
        out.append(family)
    bandwidth = GaugeMetricFamily(
        "trainmeter_rank_bus_bandwidth_bytes_per_second",
        "Bus bandwidth of each rank's collectives per operation kind and group size (nccl-tests' busbw: bytes / "
        "time x the operation's factor).",
        labels=[*run_labels, "rank", "op", "group_size"],
    )
    for key in sorted(k for k in snapshot.metrics if k.startswith(BUS_BANDWIDTH)):
        value = _known(snapshot, key)
        parts = key.split(".")
        if value is None or value.value is None or len(parts) != 4 or not parts[3].startswith("rank"):
            continue
        rank = parts[3].removeprefix("rank")
        host = hosts.get(int(rank)) if rank.isdigit() else None
        node = who.node_of(host) if host is not None else who.node
        bandwidth.add_metric([who.job, node, rank, parts[1], parts[2]], value.value)
    out.append(bandwidth)
    straggler = GaugeMetricFamily(
        "trainmeter_straggler_rank",
        "The rank that makes the others wait in their collectives (the value), its host and what was slow on it.",
        labels=[*run_labels, "host", "cause"],
    )
    waited = GaugeMetricFamily(
        "trainmeter_straggler_wait_seconds",
        "How long per step the other ranks wait for the rank that waits least (the straggler once it is named).",
        labels=run_labels,
        unit="seconds",
    )
    rank_value, wait = _known(snapshot, "straggler_rank"), _known(snapshot, "straggler_wait_s")
    if wait is not None and wait.value is not None:
        waited.add_metric([who.job, who.node], wait.value)
        if rank_value is not None and rank_value.value is not None:
            host = rank_value.label or ""
            straggler.add_metric([who.job, who.node, host, wait.label or ""], rank_value.value)
    out.extend([straggler, waited])
    yield from (f for f in out if f.samples)
