"""The hang's culprit: from the ranks' stall reports (the ``collective.stall`` fact each rank's agent sends when it
stops stepping), the collective some ranks wait in and the ranks of its group that never entered it.

Pure: reads a snapshot's facts, no clock, no I/O. Each rank's report is its own view (the sequence numbers it entered
and completed per process group, the collectives it waits in, a phase it is in, its stacks); no clocks of two hosts
are compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainmeter_core.model import records

#: The per-rank fact an agent sends after its rank stopped stepping (``trainmeter_agent/_collectives.py``).
STALL_FACT = "collective.stall"


@dataclass(frozen=True)
class CollectiveHang:
    """Ranks wait in collective ``seq`` (``op``) of process group ``group``; ``missing`` never entered it.

    ``silent``: the missing ranks that sent no report (gone, or their agent is not heard); ``phases``: the missing
    ranks in a phase tm knows (a checkpoint, an evaluation), by rank; ``stacks``: every reporting rank's stacks.
    """

    group: str
    desc: str
    op: str
    seq: int
    entered: list[int]
    missing: list[int]
    silent: list[int] = field(default_factory=list)
    phases: dict[int, str] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)


def stall_reports(facts: Mapping[str, records.Fact]) -> dict[int, dict]:
    """The current stall report of each rank that is stalled (a rank stepping again has sent ``stalled`` False)."""
    reports = {}
    prefix = STALL_FACT + "@rank"
    for key, fact in facts.items():
        if not key.startswith(prefix):
            continue
        value = fact.value
        if isinstance(value, Mapping) and value.get("stalled"):
            reports[fact.rank or 0] = value
    return reports


def find_hang(facts: Mapping[str, records.Fact]) -> CollectiveHang | None:
    """The collective the most stalled ranks wait in (the lowest sequence number on a tie), and who never entered
    it; None when no stalled rank waits in a collective, or no rank that reported stayed short of it (every rank of
    its group entered it, or those that did not sent no report here)."""
    reports = stall_reports(facts)
    waited: dict[tuple[str, int], tuple[str, set[int]]] = {}
    for rank, report in reports.items():
        for wait in report.get("waiting") or ():
            try:
                key = (str(wait["group"]), int(wait["seq"]))
            except (KeyError, TypeError, ValueError):
                continue
            waited.setdefault(key, (str(wait.get("op") or "collective"), set()))[1].add(rank)
    if not waited:
        return None
    (group, seq), (op, _) = max(waited.items(), key=lambda item: (len(item[1][1]), -item[0][1]))
    members: list[int] = []
    desc = ""
    for report in reports.values():
        known = (report.get("groups") or {}).get(group)
        if known and known.get("ranks"):
            members = sorted(int(r) for r in known["ranks"])
            desc = str(known.get("desc") or "")
            break
    entered, missing, silent = [], [], []
    for rank in members:
        report = reports.get(rank)
        if report is None:
            missing.append(rank)
            silent.append(rank)
            continue
        known = (report.get("groups") or {}).get(group) or {}
        (entered if int(known.get("entered", 0)) >= seq else missing).append(rank)
    if len(silent) == len(missing):
        # Every rank that did not enter is unheard: on one node of a job its peers report to the job hub, not here,
        # and a rank gone is the died rule's. Only a rank heard, alive and short of the collective is named.
        return None
    phases = {rank: str(reports[rank]["phase"]) for rank in missing if reports.get(rank, {}).get("phase")}
    steps = {rank: int(report["step"]) for rank, report in reports.items() if report.get("step") is not None}
    stacks = {rank: str(report["stacks"]) for rank, report in sorted(reports.items()) if report.get("stacks")}
    return CollectiveHang(group, desc, op, seq, entered, missing, silent, phases, steps, stacks)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def describe(hang: CollectiveHang, wait_s: float) -> str:
    """One line: who waits in what since when, and who never came."""
    group = f"group {hang.group}" + (f" ({hang.desc})" if hang.desc else "")
    alive = [r for r in hang.missing if r not in hang.silent]
    parts = []
    if alive:
        parts.append(f"{_ranks(alive)}, alive, never entered it")
    if hang.silent:
        parts.append(f"{_ranks(hang.silent)} never entered it and sent no report")
    verb = "waits" if len(hang.entered) == 1 else "wait"
    return (
        f"{_ranks(hang.entered)} {verb} in {hang.op} #{hang.seq} of {group} for {wait_s:.0f} s: "
        + "; ".join(parts)
        + " (every rank's stacks are attached)"
    )


def describe_phase(hang: CollectiveHang) -> str:
    """The wait explained by a phase tm knows: "ranks 1, 2 wait for rank 0's checkpoint"."""
    named = ", ".join(f"rank {rank}'s {phase}" for rank, phase in sorted(hang.phases.items()))
    verb = "waits" if len(hang.entered) == 1 else "wait"
    return f"{_ranks(hang.entered)} {verb} in {hang.op} #{hang.seq} for {named}: no hang"
