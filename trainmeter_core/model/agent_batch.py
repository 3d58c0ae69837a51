"""The agent's batch on the wire, a ``window`` message: the records of one flush of a training process, most of them
still as the short arrays its hooks made, which the hub turns into the records they stand for. Named for what it
carries, not ``window.py``: a window in the engine is the training window its averages cover (``engine/training_window.py``).

A tight loop makes a step, a loss and a data wait per iteration. Building those records (a Struct with a dozen fields
and the producer's header each, then a map on the wire) cost the training process about 3 µs per iteration, more
than any of its probes; encoding the arrays the hooks already hold costs it 0.07 µs. The hub (another process) builds
each record here, exactly as the agent would have: the run log, subscribers and replay see the same records.

A window is one message, ``[b"window", MessagePack [header, [item, ...]]]``. An item is either a whole record (a
map, as in a ``batch``) or an array whose first element says what it stands for (``STEADY_STEP``, ``BARE_PHASE``,
``BARE_METRIC``). Pure: no I/O, no clock.
"""

import msgspec

from trainmeter_core.model import records

#: The topic of a window message, beside ``batch`` and the record kinds.
WINDOW_TOPIC = b"window"
#: The first element of each array item: what the array stands for.
STEADY_STEP, BARE_PHASE, BARE_METRIC = 1, 2, 3


class WindowHeader(msgspec.Struct, kw_only=True):
    """What every record of the window shares: its producer's header, its drop count when the window left, and the
    two clocks read then (each record's ``wall`` is its ``t`` carried onto the wall clock by their difference)."""

    v: int
    source: str
    host: str
    pid: int
    rank: int | None = None
    dropped: int = 0
    now_t: float
    now_wall: float


class SteadyStep(msgspec.Struct, array_like=True, tag=STEADY_STEP):
    """A steady iteration: its ``step`` record, after the ``train_loss`` metric read at backward() when ``loss`` is
    not None (dated ``loss_t``, under ``loss_origin``). ``agent_us`` is None where the agent did not time the
    iteration (it times one in 16)."""

    step: int
    t: float
    step_time_s: float
    optimizers: int
    agent_us: float | None
    micro_batches: int
    tokens: int
    tokens_source: records.TokenSource
    dp: int
    loss: float | None
    loss_t: float | None
    loss_origin: str


class BarePhase(msgspec.Struct, array_like=True, tag=BARE_PHASE):
    """A ``phase`` record with no field beyond these (a data wait), dated at its end."""

    phase: records.PhaseName
    start_t: float
    end_t: float
    step: int | None
    probe: str


class BareMetric(msgspec.Struct, array_like=True, tag=BARE_METRIC):
    """A ``metric`` record (``emit()``, a tracker tap, a loss read at backward())."""

    t: float
    values: dict[str, float]
    step: int | None
    origin: str


_window = msgspec.msgpack.Decoder(tuple[WindowHeader, list[msgspec.Raw]], ext_hook=records.reject_extension)
_item = msgspec.msgpack.Decoder(SteadyStep | BarePhase | BareMetric, ext_hook=records.reject_extension)
_encoder = msgspec.msgpack.Encoder()
# The first byte of a MessagePack map: fixmap, map16, map32. An item that starts otherwise is an array item.
_MAP_MARKERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])


def encode_window(header: dict, items: list) -> bytes:
    """The payload of a window: ``header`` (the fields of ``WindowHeader``) and its items, records or arrays."""
    return _encoder.encode((header, items))


def split_window(payload: bytes) -> tuple[WindowHeader, list[msgspec.Raw]]:
    """The header and the raw bytes of each item. Raises MalformedRecord for anything else."""
    try:
        return _window.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError) as exc:
        raise records.MalformedRecord(f"window: {exc}") from None


def is_record(item: msgspec.Raw) -> bool:
    """Whether an item is a whole record (a map), to be checked as any producer's record is."""
    view = memoryview(item)
    return len(view) > 0 and view[0] in _MAP_MARKERS


def expand(item: msgspec.Raw, header: WindowHeader) -> list[records.Record]:
    """The records an array item stands for, with the window's header. Raises MalformedRecord for an array that is not
    one of the three items, or breaks their schema."""
    try:
        bare = _item.decode(item)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError) as exc:
        raise records.MalformedRecord(f"window item: {exc}") from None
    now_t, now_wall = header.now_t, header.now_wall
    stamp = {"v": header.v, "source": header.source, "host": header.host, "pid": header.pid}
    if header.rank is not None:
        stamp["rank"] = header.rank
    if header.dropped:
        stamp["dropped"] = header.dropped
    if type(bare) is SteadyStep:
        step = records.Step(
            step=bare.step,
            t=bare.t,
            wall=now_wall - (now_t - bare.t),
            step_time_s=bare.step_time_s,
            optimizers=bare.optimizers,
            agent_us=bare.agent_us,
            micro_batches=bare.micro_batches,
            tokens=bare.tokens,
            tokens_source=bare.tokens_source,
            dp=bare.dp,
            tokens_global=bare.tokens * bare.dp,
            **stamp,
        )
        if bare.loss is None or bare.loss_t is None:
            return [step]
        loss = records.Metric(
            values={"train_loss": bare.loss},
            step=bare.step,
            t=bare.loss_t,
            wall=now_wall - (now_t - bare.loss_t),
            origin=bare.loss_origin,
            **stamp,
        )
        return [loss, step]
    if type(bare) is BarePhase:
        return [
            records.Phase(
                phase=bare.phase,
                start_t=bare.start_t,
                end_t=bare.end_t,
                step=bare.step,
                probe=bare.probe,
                t=bare.end_t,
                wall=now_wall - (now_t - bare.end_t),
                **stamp,
            )
        ]
    return [
        records.Metric(
            values=bare.values,
            step=bare.step,
            t=bare.t,
            wall=now_wall - (now_t - bare.t),
            origin=bare.origin,
            **stamp,
        )
    ]
