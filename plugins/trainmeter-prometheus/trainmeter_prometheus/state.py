"""What the exporter knows of the run: the latest snapshot, the latest GPU sample of each device, the latest bus
statistics, the alerts, the agent's own time per rank, component crashes.

Pure: records are fed in hub order and times are given by the caller; no I/O, no clock. It derives nothing the engine
computes (every training number comes from the engine's snapshot); it only keeps the latest of each record and sums
what a Prometheus counter needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainmeter_core.api import Alert, SampleGpu, Snapshot, records

#: The record kinds the exporter reads from the bus.
KINDS = ("snapshot", "sample.gpu", "bus.stats", "alert", "step", "component")


@dataclass
class AgentTime:
    """The agent's own time inside the training process, summed over the steps that carried it (``step.agent_us``)."""

    seconds: float = 0.0
    steps: int = 0


@dataclass
class ExporterState:
    snapshot: Snapshot | None = None
    #: (host, index) -> (the latest sample.gpu of that device, when it was received in the caller's seconds)
    gpus: dict[tuple[str, int], tuple[SampleGpu, float]] = field(default_factory=dict)
    bus_stats: Any = None  # records.BusStats
    #: (rule, subject) -> the alert that opened the episode still open
    firing: dict[tuple[str, str | None], Alert] = field(default_factory=dict)
    #: (rule, severity) -> episodes fired over the run
    fired: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (host, rank) -> the agent's own time
    agent: dict[tuple[str, int], AgentTime] = field(default_factory=dict)
    #: component name -> crashes
    crashes: dict[str, int] = field(default_factory=dict)
    _alert_seqs: set[int] = field(default_factory=set)

    def feed(self, record: Any, received_s: float = 0.0) -> None:
        """One record from the bus; ``received_s`` is when it arrived, in the caller's monotonic seconds."""
        if isinstance(record, records.Snapshot):
            self.snapshot = record
        elif isinstance(record, records.SampleGpu):
            self.gpus[(record.host, record.index)] = (record, received_s)
        elif isinstance(record, records.BusStats):
            self.bus_stats = record
        elif isinstance(record, records.Alert):
            self.alert(record.rule, record.state, record.severity, record.subject, record.seq, record)
        elif isinstance(record, records.Step):
            if record.agent_us is not None:
                cost = self.agent.setdefault((record.host, record.rank or 0), AgentTime())
                cost.seconds += record.agent_us / 1e6
                cost.steps += 1
        elif isinstance(record, records.Component):
            if record.event == "crashed":
                self.crashes[record.name] = self.crashes.get(record.name, 0) + 1

    def alert(
        self,
        rule: str,
        state: str,
        severity: str,
        subject: str | None,
        seq: int | None,
        record: Alert | None = None,
    ) -> None:
        """An alert from the bus or from ``alerts.jsonl``; each hub sequence number counts once."""
        if seq is not None:
            if seq in self._alert_seqs:
                return
            self._alert_seqs.add(seq)
        if state == "fired":
            self.fired[(rule, severity)] = self.fired.get((rule, severity), 0) + 1
            self.firing[(rule, subject)] = record or records.Alert(
                rule=rule, state="fired", severity=severity, message="", subject=subject
            )
        elif state == "cleared":
            self.firing.pop((rule, subject), None)

    def alert_line(self, line: Mapping[str, Any]) -> None:
        """One line of the run's ``alerts.jsonl`` (the alerts that fired before the exporter started)."""
        rule, state = line.get("rule"), line.get("state")
        if not isinstance(rule, str) or state not in ("fired", "cleared"):
            return
        severity = line.get("severity") if isinstance(line.get("severity"), str) else "warning"
        subject = line.get("subject") if isinstance(line.get("subject"), str) else None
        seq = line.get("seq") if isinstance(line.get("seq"), int) else None
        self.alert(rule, state, severity, subject, seq)

    def fresh_gpus(self, now_s: float, max_age_s: float) -> list[SampleGpu]:
        """The latest sample of each device received within ``max_age_s``, by host and index: a GPU no longer sampled
        drops out of /metrics instead of showing its last numbers for ever."""
        return [
            sample
            for key, (sample, received_s) in sorted(self.gpus.items())
            if now_s - received_s <= max_age_s
        ]
