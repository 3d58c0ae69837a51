"""Blocks as an agent fills them, for the tests of whoever takes them in (the hub, the job hub): each steady step
after its data wait, with its loss read at backward(). Hand-made so a test knows every row it sent."""

from __future__ import annotations

import msgspec

from trainmeter_core.model import records

STEP_S = 0.25


def steady_block(
    first_step: int,
    steps: int,
    *,
    host: str = "h",
    pid: int = 7,
    rank: int | None = 1,
    source: str = "agent",
    dropped: int = 0,
) -> records.Block:
    """``steps`` steady iterations from ``first_step``, each a data wait, its loss and its step: 3 rows a step, in
    the order the agent saw them (phase, loss metric, step)."""
    numbers = list(range(first_step, first_step + steps))
    ends = [100.0 + step * STEP_S for step in numbers]
    return records.Block(
        rows=3 * steps,
        order="ps" * steps,
        step=numbers,
        step_t=ends,
        step_time_s=[STEP_S] * steps,
        optimizers=[1] * steps,
        agent_us=[None] * steps,
        micro_batches=[1] * steps,
        tokens=[4096] * steps,
        tokens_source="input_ids",
        dp=1,
        loss=[2.0 + 1.0 / step for step in numbers],
        loss_t=[end - 0.01 for end in ends],
        phase=["data_wait"] * steps,
        phase_start_t=[end - STEP_S for end in ends],
        phase_end_t=[end - STEP_S + 0.02 for end in ends],
        phase_step=numbers,
        phase_probe=["dataloader"] * steps,
        v=records.SCHEMA_VERSION,
        source=source,
        host=host,
        pid=pid,
        rank=rank,
        dropped=dropped,
        t=ends[-1] if ends else 100.0,
        wall=1.7e9,
    )


def _mapping(block: records.Block) -> dict:
    return records.to_builtins(block)


def malformed_block(rng, host: str = "h") -> tuple[str, bytes]:
    """What is wrong, and the bytes of a block a hub must refuse: columns that disagree with ``order`` or ``rows``,
    wrong types, times that are not finite numbers, a ``rows`` that lies, no rows at all, or bytes cut short."""
    steps = rng.randrange(1, 6)
    data = _mapping(steady_block(1, steps, host=host))
    choice = rng.randrange(12)
    if choice == 0:
        name = rng.choice(["step", "step_t", "tokens", "loss", "loss_t", "phase", "phase_end_t", "agent_us"])
        data[name] = data[name][:-1] if rng.random() < 0.5 else [*data[name], data[name][0]]
        why = f"{name} one entry off"
    elif choice == 1:
        name, value = rng.choice(
            [("step", "one"), ("step_t", "late"), ("tokens", 1.5), ("phase", "nap"), ("loss", "low")]
        )
        data[name][rng.randrange(steps)] = value
        why = f"{name} holding {value!r}"
    elif choice == 2:
        name, value = rng.choice(
            [("rows", "3"), ("order", 3), ("step", 5), ("metric_values", [1.0]), ("dp", "1")]
        )
        data[name] = value
        why = f"{name} of the wrong type"
    elif choice == 3:
        name = rng.choice(["step_t", "step_time_s", "phase_start_t", "phase_end_t", "loss_t"])
        data[name][rng.randrange(steps)] = rng.choice([float("nan"), float("inf"), float("-inf")])
        why = f"{name} not finite"
    elif choice == 4:
        data[rng.choice(["t", "wall"])] = rng.choice([float("nan"), float("inf")])
        why = "its own clock not finite"
    elif choice == 5:
        data["rows"] += rng.choice([-2, -1, 1, 2, 1000, -data["rows"]])
        why = "rows lies"
    elif choice == 6:
        data = _mapping(steady_block(1, 0, host=host))
        why = "empty"
    elif choice == 7:
        data["order"] = data["order"].replace("p", "x", 1)
        why = "a letter no row is"
    elif choice == 8:
        variant = rng.randrange(4)
        if variant != 1:
            del data["tokens_source"]
        if variant:
            data["tokens_absent"] = "" if variant == 3 else "no ids"
        if variant == 3:
            data["tokens"] = []
        why = (
            "steps without tokens_source",
            "both a tokens_source and a tokens_absent",
            "tokens_absent beside a tokens column",
            "tokens_absent without a reason",
        )[variant]
    elif choice == 9:
        data["loss"][0] = None  # its time stays: a time without its loss
        data["rows"] -= 1
        why = "a loss time without its loss"
    elif choice == 10:
        payload = records.encode(steady_block(1, steps, host=host))
        return "cut short", payload[: rng.randrange(1, len(payload))]
    else:
        return "not a mapping", rng.choice(
            [b"\x93\x01\x02\x03", b"\xc1", rng.randbytes(rng.randrange(0, 40))]
        )
    return why, msgspec.msgpack.encode(data)
