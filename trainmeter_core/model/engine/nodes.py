"""A job of several nodes in the job hub's engine: each node's clock mapped onto the hub's, its state (live, behind,
lost, ended), the straggler node, and the per-node part of the snapshot. Pure: no I/O, no clock."""

from __future__ import annotations

import itertools

import msgspec

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine.builder import EI, SnapshotBuilder
from trainmeter_core.model.engine.state import EngineState, NodeState

# Time is the hub's: a node's record is moved onto it by the latest ``clock`` record for its host before any handler
# reads it. A single-node run never sees a ``node`` or ``clock`` record, and nothing here changes it.

# Times a record carries besides its header's ``t``, all on its own host's clock, so moved with it.
_TIME_FIELDS: dict[type, tuple[str, ...]] = {
    records.Phase: ("start_t", "end_t"),
    records.SampleGpu: ("gpm_window_start_t",),
}
# Steps whose reports from every node are awaited: a node whose link is down reports its steps when it returns, up to
# this many steps late; older ones are let go (they then never count towards the straggler).
MAX_STEP_MARKS = 1024
#: The kinds this module reads (the job hub's own), and those another node sends about itself that the job's numbers
#: leave out: its run's end is not the job's, and the host metrics are the job hub's host's.
JOB_KINDS = (records.NodeEvent, records.ClockMap)
_OWN_HOST_ONLY = (records.RunEnd, records.SampleHost, records.SampleNode)
_EVENT_STATE = {
    "joined": "live",
    "resumed": "live",
    "caught_up": "live",
    "behind": "behind",
    "lost": "lost",
    "ended": "ended",
}


def map_clock(record: records.Record, offset_s: float) -> records.Record:
    """``record`` with every time it carries moved from its node's monotonic clock onto the hub's."""
    changes: dict[str, float] = {}
    if record.t:
        changes["t"] = record.t + offset_s
    for name in _TIME_FIELDS.get(type(record), ()):
        value = getattr(record, name)
        if value is not None:
            changes[name] = value + offset_s
    return msgspec.structs.replace(record, **changes) if changes else record


def node_of(state: EngineState, host: str, node_rank: int) -> NodeState:
    node = state.nodes.get(host)
    if node is None:
        node = state.nodes[host] = NodeState(node_rank=node_rank)
    return node


def arrive(state: EngineState, record: records.Record) -> records.Record | None:
    """A record of a job as the engine's handlers read it, or None when it is this module's alone (``node``, ``clock``)
    or another node's word about its own host (its run's end, its process tree), which the job's numbers leave out.
    Another node's record is moved onto the hub's clock first; a step, on any node, marks when its host reported it.
    """
    if isinstance(record, records.ClockMap):
        on_clock(state, record)
        return None
    if isinstance(record, records.NodeEvent):
        on_node(state, record)
        return None
    node = state.nodes.get(record.host)
    if node is not None:
        if node.offset_s is not None:
            record = map_clock(record, node.offset_s)
        seen(node, record.t)
        if isinstance(record, _OWN_HOST_ONLY):
            return None
    if isinstance(record, records.Step):
        mark_step(state, record.host, record.rank or 0, record.step, record.t)
    return record


def arrive_rows(state: EngineState, host: str, rows: list[records.Record]) -> None:
    """A block's rows from ``host``, each as ``arrive`` takes a record fed alone but for its step's mark (the caller
    marks each step before its handler takes it): moved onto the hub's clock by ``map_clock``'s rule, and the node's
    latest record seen. Moved in place, so only for rows nobody else holds (a block's, built by its reader); a block's
    rows are steps, metrics and phases, none of them another node's word about its own host."""
    node = state.nodes.get(host)
    if node is None:
        return
    offset = node.offset_s
    if offset is not None:
        phase = records.Phase
        for row in rows:
            t = row.t
            if t:
                row.t = t + offset
            if type(row) is phase:  # its other times (_TIME_FIELDS), never None in a phase
                row.start_t += offset
                row.end_t += offset
    last_t = node.last_t
    for row in rows:  # seen(), row by row
        t = row.t
        if t and (last_t is None or t > last_t):
            last_t = t
    node.last_t = last_t


def own_run_start(state: EngineState, record: records.RunStart) -> bool:
    """Whether a ``run.start`` is this run's own (the first one, or its host's), not another node's forwarded one."""
    if state.host is None:
        state.host = record.host
        state.job = record.job
        if record.job is not None and record.job.node_rank != 0 and state.steps == 0:
            state.clock_rank = None  # a node without rank 0: its first rank heard from keeps its clock
    return record.host not in state.nodes


def is_clock(state: EngineState, rank: int) -> bool:
    """Whether a step or phase of ``rank`` (0 for a record without one) is the step clock's. The clock is rank 0, except
    on a node of a job that does not hold it (node 1's run holds ranks 2 and 3, say): there the first rank heard from
    keeps it, as every rank of a node steps alike."""
    clock = state.clock_rank
    if clock is None:
        clock = state.clock_rank = rank
    return rank == clock


def clock_name(state: EngineState) -> str:
    """The step clock's rank in words, for formulas (``rank 0``; a node's that has not heard from a rank yet: ``the
    node's first rank``)."""
    return "the node's first rank" if state.clock_rank is None else f"rank {state.clock_rank}"


def on_clock(state: EngineState, record: records.ClockMap) -> None:
    node = node_of(state, record.node_host, record.node_rank)
    node.offset_s = record.offset_s
    node.uncertainty_s = record.uncertainty_s
    node.basis = record.basis


def on_node(state: EngineState, record: records.NodeEvent) -> None:
    node = node_of(state, record.node_host, record.node_rank)
    node.node_rank = record.node_rank
    if record.node_run:
        node.node_run = record.node_run
    if record.event == "gap":
        node.gaps += 1
        node.gap_records += record.lost or 0
        return
    state_now = _EVENT_STATE[record.event]
    if node.state != state_now:
        node.state = state_now
        _nodes_changed()
    if record.last_kind:
        node.last_kind = record.last_kind
    node.behind = record.behind if record.event == "behind" else None
    if record.last_t is not None and (node.last_t is None or record.last_t > node.last_t):
        node.last_t = record.last_t


def seen(node: NodeState, t: float) -> None:
    if t and (node.last_t is None or t > node.last_t):
        node.last_t = t


#: The ranks of each host, counted from the state's ranks when they last changed in number: ``(the ranks mapping, its
#: length then, {host: ranks})``, replaced whole so that a thread reads one consistent tuple. Ranks are only ever added
#: and keep their host, so the count is right while the mapping and its length are the same.
_ranks_per_host: tuple[object, int, dict[str, int]] = (None, -1, {})


def _host_ranks(state: EngineState) -> dict[str, int]:
    """How many ranks each host has in the state (counted again only when a rank was added)."""
    global _ranks_per_host
    ranks = state.ranks
    cached = _ranks_per_host
    if cached[0] is ranks:
        if cached[1] == len(ranks):
            return cached[2]
        # Ranks added since (a dict keeps its order, and ranks are never taken out): only those counted
        counts = dict(cached[2])
        added = itertools.islice(ranks.values(), cached[1], None)
    else:
        counts, added = {}, iter(ranks.values())
    for rank_state in added:
        counts[rank_state.host] = counts.get(rank_state.host, 0) + 1
    _ranks_per_host = (ranks, len(ranks), counts)
    return counts


def _hosts_stepping(state: EngineState, host: str, rank: int) -> dict[str, int]:
    """Each host whose ranks take part in the straggler comparison now, with its number of ranks (``rank`` on
    ``host`` counted, whose step is being marked before the engine has seen it)."""
    counts = _host_ranks(state)
    if rank not in state.ranks:
        counts = dict(counts)
        counts[host] = counts.get(host, 0) + 1
    nodes = state.nodes
    stepping = {}
    for name, count in counts.items():
        node = nodes.get(name)
        if node is None or node.state in ("live", "behind"):
            stepping[name] = count
    return stepping


#: Bumped whenever a node's state changes: the count of hosts stepping (``_stepping_count``) is counted again after
#: it (and after a node or a rank is added, which the mappings' lengths say). One counter for every engine in the
#: process: another engine's change only makes this one count again.
_nodes_version = 0
#: ``(the ranks mapping, its length, the nodes mapping, its length, _nodes_version, the count)`` when last counted.
_stepping_counted: tuple[object, int, object, int, int, int] = (None, -1, None, -1, -1, 0)


def _nodes_changed() -> None:
    global _nodes_version
    _nodes_version += 1


def _stepping_count(state: EngineState) -> int:
    """How many hosts take part in the straggler comparison (``_hosts_stepping``'s length for a rank already known),
    counted again only when a rank or a node was added or a node's state changed."""
    global _stepping_counted
    ranks, nodes = state.ranks, state.nodes
    cached = _stepping_counted
    if (
        cached[0] is ranks
        and cached[1] == len(ranks)
        and cached[2] is nodes
        and cached[3] == len(nodes)
        and cached[4] == _nodes_version
    ):
        return cached[5]
    count = 0
    for name in _host_ranks(state):
        node = nodes.get(name)
        if node is None or node.state in ("live", "behind"):
            count += 1
    _stepping_counted = (ranks, len(ranks), nodes, len(nodes), _nodes_version, count)
    return count


#: The key of a step's marks that counts the hosts whose ranks have all reported it (no host name holds a "#").
_DONE = "#done"


def mark_step(state: EngineState, host: str, rank: int, step: int, t: float) -> None:
    """One rank of ``host`` reported ``step`` at ``t`` (the hub's clock). Once every host taking part has reported it
    from all its ranks, each host's lag behind the first one updates its EMA.

    Whether every host has is asked only when a host's last rank reports (its ranks' count reached) and, of those
    reports, only once as many hosts have as take part: asking means a pass over the job's hosts, which at every
    report made the engine's work per step grow as the job's ranks squared, and once a host a step as its hosts
    squared. The count of hosts done is a filter, never the answer: a host whose ranks grew in number while it
    reported may count twice, which only asks once more; every host whose ranks have all reported was counted at least
    once (its count of reports passed its count of ranks one at a time), so the pass runs at every report where the
    old way's would succeed."""
    marks = state.step_marks.get(step)
    if marks is None:
        marks = state.step_marks[step] = {}
        if len(state.step_marks) > MAX_STEP_MARKS:
            del state.step_marks[min(state.step_marks)]
    # Per host: the latest report of the step (its slowest rank) and how many of its ranks reported; the count rides
    # in the key "host#n" so the state stays a plain mapping of floats.
    count_key = host + "#n"
    marks[host] = max(marks.get(host, t), t)
    reported = marks[count_key] = marks.get(count_key, 0.0) + 1.0
    new_rank = rank not in state.ranks
    own = _host_ranks(state).get(host, 0) + new_rank
    if reported != own:
        return  # this host has ranks still to report the step (or reported it already: asked then)
    _host_reported(state, host, rank, step, marks, new_rank)


def mark_steps(state: EngineState, host: str, rank: int, steps: list[int], times: list[float]) -> None:
    """``mark_step`` for each of ``steps`` (at ``times``) of a rank already known, in turn: what is the same for all
    of them (the host's count of ranks, its key in the marks) looked up once."""
    if rank not in state.ranks:
        for step, t in zip(steps, times, strict=True):
            mark_step(state, host, rank, step, t)
        return
    count_key = host + "#n"
    own = _host_ranks(state).get(host, 0)
    step_marks = state.step_marks
    for step, t in zip(steps, times, strict=True):
        marks = step_marks.get(step)
        if marks is None:
            marks = step_marks[step] = {}
            if len(step_marks) > MAX_STEP_MARKS:
                del step_marks[min(step_marks)]
        latest = marks.get(host)
        marks[host] = t if latest is None or t > latest else latest  # max(latest, t), as mark_step keeps it
        reported = marks[count_key] = marks.get(count_key, 0.0) + 1.0
        if reported == own:
            _host_reported(state, host, rank, step, marks, False)


def _host_reported(
    state: EngineState, host: str, rank: int, step: int, marks: dict[str, float], new_rank: bool
) -> None:
    """Every rank of ``host`` reported ``step``: once every host taking part has, each one's lag updates its EMA."""
    done = marks[_DONE] = marks.get(_DONE, 0.0) + 1.0
    # A rank not yet known may add a host the count has not seen: then the hosts are looked over as before
    if not new_rank and done < _stepping_count(state):
        return
    hosts = _hosts_stepping(state, host, rank)
    if len(hosts) < 2 or any(marks.get(h + "#n", 0.0) < n for h, n in hosts.items()):
        return
    first = min(marks[h] for h in hosts)
    for h in hosts:
        node = state.nodes.get(h)
        lag = marks[h] - first
        if node is not None:
            node.lag_ema_s = formulas.ema(node.lag_ema_s, lag)
        else:
            state.own_lag_ema_s = formulas.ema(state.own_lag_ema_s, lag)
    del state.step_marks[step]


def node_rank_of(state: EngineState, host: str) -> int | None:
    node = state.nodes.get(host)
    if node is not None:
        return node.node_rank
    if state.job is not None and host == state.host:
        return state.job.node_rank
    return None


def nodes(snap: SnapshotBuilder) -> list[records.NodeStat]:
    """The per-node part of a job's snapshot, ``node_lost.<host>`` for the alert rule, and the straggler node."""
    state = snap.state
    if not state.nodes:
        return []
    now = state.now_t
    ranks_of: dict[str, list[int]] = {}
    for rank_id, rank in state.ranks.items():
        ranks_of.setdefault(rank.host, []).append(rank_id)
    import statistics  # a job's only: its import (fractions, decimal) would cost every start 3 ms

    stats = []
    own_rank = state.job.node_rank if state.job is not None else 0
    own_host = state.host or ""
    rows: list[tuple[str, NodeState | None, int]] = [(own_host, None, own_rank)]
    rows += [(host, node, node.node_rank) for host, node in state.nodes.items()]
    for host, node, node_rank in sorted(rows, key=lambda row: (row[2], row[0])):
        ranks = sorted(ranks_of.get(host, []))
        times = [state.ranks[r].step_time_ema_s for r in ranks if state.ranks[r].step_time_ema_s is not None]
        steps = sum(state.ranks[r].steps for r in ranks)
        step_time = statistics.median(times) if times else None  # type: ignore[type-var]
        if node is None:
            stats.append(
                records.NodeStat(
                    node_rank=node_rank,
                    host=host,
                    state="ended" if state.finished else "live",
                    ranks=ranks,
                    steps=steps,
                    step_time_s=step_time,
                    lag_s=state.own_lag_ema_s,
                    last_t=now,
                    clock_offset_s=0.0,
                    clock_uncertainty_s=0.0,
                    clock_basis="the hub's own clock",
                )
            )
            continue
        silent = now - node.last_t if now is not None and node.last_t is not None else None
        stats.append(
            records.NodeStat(
                node_rank=node_rank,
                host=host,
                state=node.state,  # type: ignore[arg-type]
                ranks=ranks,
                steps=steps,
                step_time_s=step_time,
                lag_s=node.lag_ema_s,
                last_t=node.last_t,
                last_kind=node.last_kind,
                silent_s=max(0.0, silent) if silent is not None else None,
                behind=node.behind,
                gaps=node.gaps,
                gap_records=node.gap_records,
                clock_offset_s=node.offset_s,
                clock_uncertainty_s=node.uncertainty_s,
                clock_basis=node.basis,
                node_run=node.node_run,
            )
        )
        lost = 1.0 if node.state == "lost" else 0.0
        snap.put(
            f"node_lost.{host}",
            "1 while the job hub has heard nothing from the node for longer than the heartbeat timeout",
            value=lost,
            inputs={"node_rank": EI(value=node_rank), "last_t": EI(value=node.last_t, unit="s")},
        )
    _straggler(snap, stats)
    return stats


def _straggler(snap: SnapshotBuilder, stats: list[records.NodeStat]) -> None:
    formula = (
        "the node whose ranks report a step latest, on the hub's clock: EMA of (its time − the first node's)"
    )
    timed = [s for s in stats if s.lag_s is not None]
    if len(timed) < 2:
        snap.put(
            "straggler_node_lag_s",
            formula,
            absent="needs steps reported by every node of the job",
            unit="s",
        )
        return
    slowest = max(timed, key=lambda s: (s.lag_s, -s.node_rank))
    inputs = {f"node {s.node_rank} ({s.host})": EI(value=s.lag_s, unit="s") for s in timed}
    inputs["straggler_node"] = EI(value=slowest.node_rank, source=slowest.host)
    snap.put(
        "straggler_node_lag_s",
        formula,
        value=slowest.lag_s,
        unit="s",
        label=slowest.host,
        inputs=inputs,
        note=f"the straggler is node {slowest.node_rank} ({slowest.host})",
    )
