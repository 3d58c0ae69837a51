"""Averages over the training window: each sample weighted by how long its own measurement window overlaps the span
from the first step to the latest step taken on the sample's host. Pure: no I/O, no clock."""

from __future__ import annotations

import msgspec

# The window's end moves with every step, so a sample reaching past the latest step waits in a short pending list and
# counts up to wherever the window ends; once a later step passes it, it is settled. Steps cost nothing here (only the
# host's span moves); the work happens when a sample arrives and when a snapshot reads an average.

__all__ = [
    "MAX_PENDING",
    "Pending",
    "StepSpan",
    "WindowSum",
    "add_sample",
    "average",
    "extend_span",
    "settle",
]

# Samples kept per counter beyond the latest step. Before the first step the oldest are dropped (they end before any
# window can open); after it, the oldest but one are merged (a long eval or a finished loop), which is exact unless a
# later step lands inside a merged stretch, where the stretch's mean stands for each of its parts.
MAX_PENDING = 8


class StepSpan(msgspec.Struct, kw_only=True):
    """One host's training window: the ``t`` of the first step any rank there took, and of the latest one.

    A resumed run pauses the window between attempts: ``gaps`` are the stretches from a host's last step before an
    attempt started to its first step in that attempt, and ``gap_from`` opens the one still waiting for that step.
    """

    first_t: float
    last_t: float
    gaps: list[tuple[float, float]] = []
    gap_from: float | None = None


class Pending(msgspec.Struct, array_like=True):
    """A sample that reaches past the latest step: it counts once a later step passes its end."""

    start_t: float
    end_t: float
    value: float


class WindowSum(msgspec.Struct, kw_only=True):
    """One counter's samples over the window: Σ value × overlap and Σ overlap of those settled, and those pending."""

    weighted: float = 0.0
    covered_s: float = 0.0
    pending: list[Pending] = []


def extend_span(spans: dict[str, StepSpan], host: str, t: float) -> None:
    """A step at ``t`` on ``host``: it opens the host's window, or moves its end (a step from the past moves nothing)."""
    span = spans.get(host)
    if span is None:
        spans[host] = StepSpan(first_t=t, last_t=t)
    elif t > span.last_t:
        span.last_t = t


def add_sample(
    sums: dict[str, WindowSum], name: str, start_t: float, end_t: float, value: float, span: StepSpan | None
) -> None:
    """A reading of ``name`` that covers ``[start_t, end_t]``; a span with no length weighs nothing."""
    if not start_t < end_t:
        return
    window = sums.get(name)
    if window is None:
        window = sums[name] = WindowSum()
    if span is not None and end_t <= span.last_t and not window.pending:
        # The common case (a sampler reads after the steps it covers), settled at once as settle would: no Pending
        # is made and dropped (a GPU sample comes here seven times).
        overlap = _overlap(span, start_t, end_t, end_t) if span.gaps else end_t - max(start_t, span.first_t)
        if overlap > 0:
            window.weighted += value * overlap
            window.covered_s += overlap
        return
    window.pending.append(Pending(start_t, end_t, value))
    settle(window, span)


def average(window: WindowSum | None, span: StepSpan | None) -> tuple[float, float] | None:
    """The mean over the window so far and the seconds of it the samples cover; None while nothing covers it."""
    if window is None or span is None:
        return None
    weighted, covered = window.weighted, window.covered_s
    for pending in window.pending:
        overlap = _overlap(span, pending.start_t, pending.end_t, span.last_t)
        if overlap > 0:
            weighted += pending.value * overlap
            covered += overlap
    if covered <= 0:
        return None
    return weighted / covered, covered


def _overlap(span: StepSpan, start_t: float, end_t: float, until_t: float) -> float:
    """How long ``[start_t, end_t]`` lies inside the span up to ``until_t``, less the pauses between attempts."""
    overlap = min(end_t, until_t) - max(start_t, span.first_t)
    for gap_start, gap_end in span.gaps:
        paused = min(end_t, gap_end) - max(start_t, gap_start)
        if paused > 0:
            overlap -= paused
    return overlap


def settle(window: WindowSum, span: StepSpan | None) -> None:
    """Count the pending samples the window's end has passed; keep at most ``MAX_PENDING`` of the rest."""
    pending = window.pending
    if span is None:
        if len(pending) > MAX_PENDING:
            del pending[: len(pending) - MAX_PENDING]
        return
    # _overlap written out where the run never paused (a sampler's readings come here up to seven times a sample):
    # a settled sample's overlap is its end less the later of its start and the window's first step, as max() picks
    # it; the sums are added to in the list's order, as one attribute at a time would
    last_t, first_t, gaps = span.last_t, span.first_t, span.gaps
    weighted, covered = window.weighted, window.covered_s
    kept: list[Pending] = []
    for sample in pending:
        end_t = sample.end_t
        if end_t <= last_t:
            start_t = sample.start_t
            if gaps:
                overlap = _overlap(span, start_t, end_t, end_t)
            else:
                overlap = end_t - (first_t if first_t > start_t else start_t)
            if overlap > 0:
                weighted += sample.value * overlap
                covered += overlap
        else:
            kept.append(sample)
    window.weighted, window.covered_s = weighted, covered
    while len(kept) > MAX_PENDING:
        # Keep the oldest (it may straddle the window's end) and merge the next two into one stretch.
        first, second = kept[1], kept[2]
        length = (first.end_t - first.start_t) + (second.end_t - second.start_t)
        mean = (
            first.value * (first.end_t - first.start_t) + second.value * (second.end_t - second.start_t)
        ) / length
        kept[1:3] = [Pending(min(first.start_t, second.start_t), max(first.end_t, second.end_t), mean)]
    window.pending = kept
