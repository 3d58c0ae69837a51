"""Blocks for tests: a list of step, metric and phase records (one producer's) made into the ``records.Block`` that
stands for them, and a run log's records with every run of such rows that a block can hold made into blocks.

``block_of`` is ``records.block.expand`` undone: ``expand(block_of(rows)) == rows`` whenever ``holds(rows)``. Beside
them: a synthetic steady run to make blocks of (``training_run``), a log with its blocks as rows (``expanded``), the
line the recorder writes (``log_line``), and a comparison of records that holds for NaN losses (``same``).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from trainmeter_core.model import records

_HEADER = ("v", "source", "host", "pid", "rank", "dropped")


def _header(record: records.Record) -> tuple:
    return tuple(getattr(record, name) for name in _HEADER)


def _steady(step: records.Step) -> bool:
    """Whether a block's columns can say everything a step says: its token count, or only why it has none."""
    if step.tokens is None:
        counted = (
            step.tokens_source is None
            and step.tokens_global is None
            and list(step.absent) == ["tokens"]
            and bool(step.absent["tokens"])
        )
    else:
        counted = step.tokens_source is not None and not step.absent
    return (
        counted
        and not step.skipped
        and not step.profiled
        and step.resumed_from is None
        and None not in (step.step_time_s, step.micro_batches, step.dp)
        and step.optimizers is not None
        and (step.tokens is None or step.tokens_global == step.tokens * step.dp)
    )


def _loss_of(metric: records.Record, step: records.Record) -> bool:
    """Whether ``metric`` is the loss read at backward() that a block carries with ``step``, the record after it."""
    return (
        type(metric) is records.Metric
        and type(step) is records.Step
        and metric.origin == "backward"
        and list(metric.values) == ["train_loss"]
        and metric.step == step.step
    )


def block_of(
    rows: list[records.Record], *, t: float | None = None, wall: float | None = None
) -> records.Block:
    """The block standing for ``rows`` (consecutive, of one producer), its ``seq`` the last row's. Each row's wall time
    must be its ``t`` shifted as the first row's is (a block carries one shift); ``t``/``wall`` are the block's own
    clocks (by default the first row's)."""
    first = rows[0]
    t = first.t if t is None else t
    wall = first.wall if wall is None else wall
    columns: dict[str, list] = {}

    def put(name: str, value: object) -> None:
        columns.setdefault(name, []).append(value)

    order = []
    steps = [row for row in rows if type(row) is records.Step]
    at = 0
    while at < len(rows):
        row = rows[at]
        if type(row) is records.Metric and at + 1 < len(rows) and _loss_of(row, rows[at + 1]):
            step = rows[at + 1]
            put("loss", row.values["train_loss"])
            put("loss_t", row.t)
            at += 1
            row = step
        elif type(row) is records.Step:
            put("loss", None)
            put("loss_t", None)
        if type(row) is records.Step:
            order.append("s")
            for name in ("step", "step_time_s", "optimizers", "agent_us", "micro_batches"):
                put(name, getattr(row, name))
            if row.tokens is not None:
                put("tokens", row.tokens)
            put("step_t", row.t)
        elif type(row) is records.Phase:
            order.append("p")
            put("phase", row.phase)
            put("phase_start_t", row.start_t)
            put("phase_end_t", row.end_t)
            put("phase_step", row.step)
            put("phase_probe", row.probe)
        else:
            order.append("m")
            put("metric_t", row.t)
            put("metric_values", dict(row.values))
            put("metric_step", row.step)
            put("metric_origin", row.origin)
        at += 1
    v, source, host, pid, rank, dropped = _header(first)
    losses = [metric for metric in rows if type(metric) is records.Metric and metric.origin == "backward"]
    return records.Block(
        rows=len(rows),
        order="".join(order),
        tokens_source=steps[0].tokens_source if steps else None,
        tokens_absent=steps[0].absent.get("tokens") if steps else None,
        dp=steps[0].dp if steps else None,
        loss_origin=losses[0].origin if losses else "backward",
        t=t,
        wall=wall,
        v=v,
        source=source,
        host=host,
        pid=pid,
        rank=rank,
        dropped=dropped,
        seq=rows[-1].seq,
        **columns,
    )


def holds(rows: list[records.Record]) -> bool:
    """Whether one block can stand for ``rows`` exactly (``expand`` gives them back, field by field)."""
    if not rows:
        return False
    try:
        block = block_of(rows)
        records.block.validate(block)
        return records.block.expand(block) == rows
    except (records.MalformedRecord, ValueError, TypeError, IndexError, msgspec.ValidationError):
        return False


def _fits(record: records.Record, first: records.Record) -> bool:
    """Whether ``record`` can be a row of a block whose first row is ``first`` (its wall time carried by the block's
    one shift, exactly as ``expand`` computes it)."""
    if record.wall != record.t + (first.wall - first.t):
        return False
    if type(record) is records.Step:
        return _steady(record)
    if type(record) is records.Phase:
        return not record.paths and record.detail is None
    return type(record) is records.Metric


def blockify(
    log: Iterable[records.Record | records.Unknown], at_most: int = 1000, *, rewall: bool = False
) -> list:
    """The records of a log with each run of consecutive rows that one block can hold exactly (at most ``at_most``
    records, at least two) made into that block; every other record as it was.

    With ``rewall``, a row whose wall time is not its run's shift of its ``t`` (a real agent's rows: each read the
    wall clock apart) gets it (on a copy): the result then stands for a log that differs from ``log`` in those walls
    alone, and ``expanded`` gives that log."""
    out: list = []
    run: list[records.Record] = []

    def close() -> None:
        steps = {
            (step.tokens_source, step.dp, step.tokens is None) for step in run if type(step) is records.Step
        }
        if len(run) >= 2 and len(steps) <= 1 and holds(run):
            out.append(block_of(run))
        else:
            out.extend(run)
        run.clear()

    for record in log:
        row = records.kind_of(record) in records.ROW_KINDS and record.seq is not None
        if row and rewall and run and _header(record) == _header(run[0]):
            record = msgspec.structs.replace(record, wall=record.t + (run[0].wall - run[0].t))
        if run and (
            not row
            or _header(record) != _header(run[0])
            or record.seq != run[-1].seq + 1
            or len(run) >= at_most
            or not _fits(record, run[0])
        ):
            close()
        if row and _fits(record, run[0] if run else record):
            run.append(record)
        else:
            out.append(record)
    close()
    return out


#: Where the synthetic run's wall clock stands when its monotonic clock reads 0.
WALL0 = 1_700_000_000.0


def training_run(
    steps: int, *, nan_at: int | None = None, tick_every: int = 25, host: str = "h", rank: int = 0
) -> list[records.Record]:
    """One rank's steady run in hub order, every record numbered: its start, the facts that give tokens and FLOPs,
    each step preceded by a data-wait phase and the loss read at backward() (NaN at step ``nan_at``), a learning rate
    emitted every 10 steps, a tick every ``tick_every`` steps and the end. Walls are the monotonic times shifted by
    one constant, as a block carries them."""
    agent = {"source": "agent", "host": host, "pid": 7, "rank": rank}
    out: list[records.Record] = [
        records.RunStart(
            t=0.5, run_id="r1", name="train", run_dir="/runs/r1", command=["python", "train.py"], cwd="/w",
            tm_version="0.1.0", python="3.11", platform="linux", source="launcher", host=host, pid=1,
        ),
        records.Fact(t=0.6, name="model.params", value=1_000_000, provenance="detected", origin="agent:model", **agent),
    ]  # fmt: skip
    t = 1.0
    for step in range(1, steps + 1):
        out.append(
            records.Phase(phase="data_wait", start_t=t, end_t=t + 0.001, step=step, probe="dataloader", t=t + 0.001,
                          **agent)
        )  # fmt: skip
        loss = float("nan") if step == nan_at else 5.0 / step
        out.append(
            records.Metric(values={"train_loss": loss}, step=step, origin="backward", t=t + 0.006, **agent)
        )
        out.append(
            records.Step(
                step=step, step_time_s=0.01, optimizers=1, agent_us=3.0 if step % 16 == 0 else None,
                micro_batches=1, tokens=1024, tokens_source="input_ids", dp=1, tokens_global=1024, t=t + 0.008,
                **agent,
            )
        )  # fmt: skip
        if step % 10 == 0:
            out.append(
                records.Metric(values={"lr": 1e-3 / step}, step=step, origin="emit", t=t + 0.009, **agent)
            )
        if step % tick_every == 0:
            out.append(
                records.Tick(
                    n=step // tick_every, interval_s=1.0, t=t + 0.0095, source="hub", host=host, pid=1
                )
            )
        t += 0.01
    out.append(
        records.RunEnd(t=t + 0.5, status=0, reason="exited", exit_code=0, elapsed_s=t, source="launcher", host=host,
                       pid=1)
    )  # fmt: skip
    for seq, record in enumerate(out, start=1):
        record.seq = seq
        record.wall = WALL0 + record.t
    return out


def expanded(log: Iterable[records.Record | records.Unknown]) -> list[records.Record | records.Unknown]:
    """A log with every block replaced by its rows."""
    return [
        row for item in log for row in (records.block.expand(item) if type(item) is records.Block else [item])
    ]


def log_line(record: records.Record | records.Unknown) -> bytes:
    """The record's line as the recorder writes it: the tag first, the hub's ``seq`` last."""
    data = records.to_builtins(record)
    seq = data.pop("seq", None)
    if seq is not None:
        data["seq"] = seq
    return records.to_log_line(data)


def same(got: Iterable[records.Record], want: Iterable[records.Record]) -> bool:
    """Whether two lists hold the same records, field by field (a NaN loss equals a NaN loss: compared by their
    reprs, which name every field and write each float exactly), and write the same wire bytes (a field that holds
    its default is left out of both)."""
    got, want = list(got), list(want)
    return [repr(r) for r in got] == [repr(r) for r in want] and [records.encode(r) for r in got] == [
        records.encode(r) for r in want
    ]
