"""The bus's own plumbing: the hub's counters (``bus.stats``) and the job hub's word about the nodes that forward to
it (``node``, ``clock``). Each kind is defined here once; the package's face puts it in the union. Pure: no I/O, no
clock.
"""

# Annotations are evaluated at import, as header.py says why.
from typing import Literal

from trainmeter_core.model.records.header import Record


class BusStats(Record, tag="bus.stats", kw_only=True):
    """The hub's counters, cumulative since the start of the run."""

    received: int
    published: int
    malformed: int
    unknown: int
    dropped: dict[str, int] = {}  # per producer "source@host:pid", as last reported by that producer
    dropped_total: int = 0
    flushed_seq: int | None = None
    log_bytes: int = 0
    log_segments: int = 0
    log_queue_dropped: int = 0  # records the recorder could not take (its queue was full)
    log_reserve_active: bool = (
        False  # below the free-space reserve: only run.*, step, fact, alert are written
    )
    log_reserve_skipped: int = 0
    final: bool = False


# The job: written by the job hub (node rank 0) alone, about the nodes that forward their records to it
class NodeEvent(Record, tag="node", kw_only=True):
    """The job hub's word about one node: it joined, fell silent (``lost``), came back, is behind or caught up, lost
    records it could not resend (``gap``), or ended. The header is the hub's (its host, its clock); the node is
    ``node_rank`` on ``node_host``. ``through`` is the node's forwarding sequence number up to which the hub holds
    every record; ``behind`` the records the node has sent its hub but not yet this one; ``lost`` the records that
    fell out of the node's bounded resend buffer before they got here (never resent, so counted). ``last_*`` describe
    the last record the hub received from the node, ``last_t`` mapped onto the hub's clock."""

    node_rank: int
    node_host: str
    event: Literal["joined", "lost", "resumed", "behind", "caught_up", "gap", "ended"]
    node_run: str | None = None  # the node's own run id (its local run directory's name)
    through: int | None = None
    behind: int | None = None
    lost: int | None = None
    last_kind: str | None = None
    last_t: float | None = None
    last_wall: float | None = None
    silent_s: float | None = None
    reason: str | None = None


class ClockMap(Record, tag="clock", kw_only=True):
    """How the job hub maps one node's monotonic clock onto its own: hub t = node t + ``offset_s``, good to within
    ``uncertainty_s``. The first estimate comes from the wall clocks when the node says hello (``basis`` "wall": as
    good as the clocks' synchronisation, so no bound); each later one from the round trip of a ping with the least
    delay (``basis`` "round_trip": the offset is known to ± half that round trip). ``wall_skew_s`` is how far the
    node's wall clock is from the hub's at the same instant, as the round trip sees it."""

    node_rank: int
    node_host: str
    offset_s: float
    basis: Literal["wall", "round_trip"]
    uncertainty_s: float | None = None
    rtt_s: float | None = None
    wall_skew_s: float | None = None
    samples: int = 0


def producer_key(source: str, host: str, pid: int) -> str:
    """How bus.stats names a producer."""
    return f"{source}@{host}:{pid}"
