"""A rank's per-step collective figures from torch's flight-recorder entries: which step each entry belongs to, its
bytes as nccl-tests counts them, the arrival, and the exposed wait from the backward() calls and Python's waits.

Pure: lists in, rows out; no clock, no torch, no thread (the collective probe, ``_collectives.py``, reads and sends).
"""

from __future__ import annotations

import math

#: How far before a collective's launch (its wall time carried onto the monotonic clock) a wait may seem to begin and
#: still be its own: the two clocks are read together to a few microseconds (``_collectives.clock_offset``).
WAIT_SLACK_S = 0.001

# The recorder names dtypes as c10's ScalarType does; the bytes of one element.
_DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
}


def tensor_bytes(sizes: list, dtypes: list) -> int | None:
    """The bytes of a collective's tensors (shapes and dtype names as the recorder lists them); None when a dtype is
    not known here."""
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        width = _DTYPE_BYTES.get(dtype)
        if width is None:
            return None
        count = 1
        for dim in shape:
            count *= dim
        total += count * width
    return total


def collective_bytes(entry: dict) -> int | None:
    """A collective's size as nccl-tests counts it: its largest buffer (an all_gather's output, a reduce_scatter's
    input, an all_reduce's either)."""
    sizes_in = tensor_bytes(entry.get("input_sizes") or [], entry.get("input_dtypes") or [])
    sizes_out = tensor_bytes(entry.get("output_sizes") or [], entry.get("output_dtypes") or [])
    if sizes_in is None or sizes_out is None:
        return None
    return max(sizes_in, sizes_out)


def op_name(entry: dict) -> str:
    """``all_reduce`` from the recorder's ``gloo:all_reduce`` / ``nccl:all_reduce``."""
    return _op(entry.get("profiling_name"))


def _op(profiling_name: str | None) -> str:
    return (profiling_name or "unknown").split(":", 1)[-1]


#: A row's keys of each operation by the recorder's name of it (``_op_keys``), and the most names kept: an entry's
#: keys come from a dictionary lookup, not four strings formatted per collective.
_OP_KEYS: dict[str | None, tuple[str, str, str, str]] = {}
_OP_KEYS_MAX = 256


def _op_keys(profiling_name: str | None) -> tuple[str, str, str, str]:
    """The row's keys of an operation: its count, time, timed count and bytes."""
    keys = _OP_KEYS.get(profiling_name)
    if keys is None:
        op = _op(profiling_name)
        keys = (
            f"collective_{op}_count",
            f"collective_{op}_time_s",
            f"collective_{op}_timed",
            f"collective_{op}_bytes",
        )
        if len(_OP_KEYS) < _OP_KEYS_MAX:
            _OP_KEYS[profiling_name] = keys
    return keys


def step_rows(
    entries: list[dict],
    boundaries: list[tuple[int, float]],
    offset_s: float,
    backwards: list[tuple[float, float]] = (),
    waits: list[tuple[float, float]] = (),
) -> tuple[list, int]:
    """Per-step, per-group figures from recorder entries and step boundaries ((step, monotonic end time), in order).

    An entry belongs to the first step that ended after it was created (its wall time less ``offset_s``, the wall
    clock's lead over the monotonic one). Returns the rows ``(t, step, group, values)`` of the steps that are over and
    the last ``record_id`` they used: entries after the last boundary wait for the next read. ``arrival_s`` is the time
    from the step's start (the previous boundary) to its first collective in the group, on this rank's own clock.
    ``backwards`` are the (start, end) of the outermost ``backward()`` calls: a step's exposed wait
    (``collective_exposed_s``, in the row of the group of that collective) is the end of its last backward that
    launched a collective less the launch of the last one (DDP's reducer waits for its buckets once the last is
    launched, at the end of backward), plus the ``waits``, (start, end) of each ``Work.wait()`` Python made outside
    backward (a synchronous collective's own wait among them) that ended in the step; without a backward's figure it
    is in the row of the step's last collective's group.
    """
    rows: list = []
    used = -1
    if not boundaries:
        return rows, used
    launched: dict[int, list[tuple[float, str]]] = {}  # per step: (created, group) in order
    figures: dict[tuple[int, str], dict] = {}
    starts: dict[int, float | None] = {}
    previous = None
    for step, end_t in boundaries:
        starts[step] = previous
        previous = end_t
    ends = [end_t for _, end_t in boundaries]
    index = 0
    created = [entry["time_created_ns"] / 1e9 - offset_s for entry in entries]
    durations = wait_durations(entries, waits, offset_s, created)
    for entry, created_t in zip(entries, created, strict=True):
        while index < len(ends) and ends[index] <= created_t:
            index += 1
        if index == len(ends):
            break  # this one and the rest belong to a step not over yet
        step, end_t = boundaries[index]
        used = max(used, entry["record_id"])
        group = str((entry.get("process_group") or ("?",))[0])
        row = figures.get((step, group))
        if row is None:
            row = figures[(step, group)] = {
                "end_t": end_t,
                "collective_count": 0.0,
                "collective_bytes": 0.0,
                "collective_seq_first": float(entry["collective_seq_id"]),
                "first_t": created_t,
                "bytes_known": True,
            }
        row["collective_count"] += 1
        launched.setdefault(step, []).append((created_t, group))
        row["collective_seq_last"] = float(entry["collective_seq_id"])
        count_key, time_key, timed_key, bytes_key = _op_keys(entry.get("profiling_name"))
        size = collective_bytes(entry)
        row[count_key] = row.get(count_key, 0.0) + 1
        duration = durations.get(entry["record_id"]) if durations else None
        if duration is not None:
            row[time_key] = row.get(time_key, 0.0) + duration
            row[timed_key] = row.get(timed_key, 0.0) + 1
            row["timed"] = True
        if size is None:
            row["bytes_known"] = False
        else:
            row["collective_bytes"] += size
            row[bytes_key] = row.get(bytes_key, 0.0) + size
    tails = exposed_waits(launched, backwards, boundaries)
    waited = waits_by_step(waits, boundaries)
    for step, times in launched.items():
        tail = tails.get(step)
        if tail is None and step not in waited:
            continue
        exposed_s, group = tail if tail is not None else (0.0, times[-1][1])
        figures[(step, group)]["collective_exposed_s"] = exposed_s + waited.get(step, 0.0)
    for (step, group), row in figures.items():
        end_t, first_t = row.pop("end_t"), row.pop("first_t")
        # Only a row with a timed collective has counts of them to compare (none in a DDP step: its waits are C++'s).
        timed_keys = [k for k in row if k.endswith("_timed")] if row.pop("timed", False) else []
        for key in timed_keys:
            op = key[len("collective_") : -len("_timed")]
            if row.pop(key) != row[f"collective_{op}_count"]:
                del row[
                    f"collective_{op}_time_s"
                ]  # some of its collectives untimed: a time of part of the bytes
        if not row.pop("bytes_known"):
            row = {
                k: v for k, v in row.items() if not k.endswith("_bytes")
            }  # a dtype not known: no bytes, not 0
        start_t = starts.get(step)
        if start_t is not None:
            row["collective_arrival_s"] = max(0.0, first_t - start_t)
        rows.append((end_t, step, group, row))
    rows.sort(key=lambda r: (r[1], r[2]))
    return rows, used


def exposed_waits(
    launched: dict[int, list[tuple[float, str]]],
    backwards: list[tuple[float, float]],
    boundaries: list[tuple[int, float]],
) -> dict[int, tuple[float, str]]:
    """Per step, the exposed wait of its last backward that launched a collective, and that collective's group: one
    walk over the steps and the backward calls, both in time order."""
    out: dict[int, tuple[float, str]] = {}
    index = 0
    for step, end_t in boundaries:
        mine = []
        while index < len(backwards) and backwards[index][1] <= end_t:
            mine.append(backwards[index])
            index += 1
        times = launched.get(step)
        if not times:
            continue
        for begin, end in reversed(mine):
            inside = [(t, group) for t, group in times if begin <= t <= end]
            if inside:
                last_t, group = inside[-1]
                out[step] = (end - last_t, group)
                break
    return out


def wait_durations(
    entries: list[dict], waits: list[tuple[float, float]], offset_s: float, created: list[float] | None = None
) -> dict[int, float]:
    """The duration of each collective a wait Python made saw through, by ``record_id``: from the collective's launch
    to the end of the first wait that began after it and before the next collective's launch (a synchronous
    collective of ``torch.distributed`` waits at once). On this rank's own clock: it holds the rank's wait for the
    others to arrive. A collective no such wait followed (DDP's reducer waits in C++) has none. ``created``: each
    entry's launch on the monotonic clock, where the caller has them already."""
    out: dict[int, float] = {}
    if not waits:
        return out
    if created is None:
        created = [entry["time_created_ns"] / 1e9 - offset_s for entry in entries]
    index = 0
    for i, entry in enumerate(entries):
        created_t = created[i]
        next_t = created[i + 1] if i + 1 < len(entries) else math.inf
        # A wait begins microseconds after its collective's launch; the launch is on the wall clock, carried onto the
        # monotonic one, so a wait may seem to begin a little before it (WAIT_SLACK_S).
        while index < len(waits) and waits[index][0] < created_t - WAIT_SLACK_S:
            index += 1
        if index < len(waits) and waits[index][0] < next_t - WAIT_SLACK_S:
            if waits[index][1] > created_t:  # (one that ended before the launch, as carried, times nothing)
                out[entry["record_id"]] = waits[index][1] - created_t
            index += 1
    return out


def waits_by_step(waits: list[tuple[float, float]], boundaries: list[tuple[int, float]]) -> dict[int, float]:
    """The time spent in waits that ended in each step (after the previous boundary, by the step's own)."""
    out: dict[int, float] = {}
    index = 0
    previous = None
    for step, end_t in boundaries:
        while index < len(waits) and waits[index][1] <= end_t:
            begin, end = waits[index]
            index += 1
            if previous is not None and end <= previous:
                continue  # of a step already counted
            out[step] = out.get(step, 0.0) + (end - begin)
        previous = end_t
    return out


def step_summaries(rows: list, group_sizes: dict[str, int]) -> list[tuple[float, int, dict]]:
    """One row per step, the collectives of all its groups together, as the engine's straggler and bus bandwidth read
    them (docs/bus.md, "Collective metrics": origin ``collectives``): ``collective_wait_s``, the step's exposed wait
    (the ``collective_exposed_s`` of its group rows added up: a step's is in one of them), absent where no row has
    one; and per operation and group size, ``coll.<op>.<n>.count``, ``coll.<op>.<n>.bytes`` (what the rank put in:
    an all_gather's input; no bytes where a dtype is not known; nothing for a group whose size is not known) and
    ``coll.<op>.<n>.time_s`` where every one of them was timed (``wait_durations``: a wait Python made; the recorder
    gives no durations on Gloo, so DDP's reducer's all_reduces have none, and their bus bandwidth is absent)."""
    steps: dict[int, tuple[float, dict]] = {}
    for end_t, step, group, values in rows:
        t, summary = steps.setdefault(step, (end_t, {}))
        exposed = values.get("collective_exposed_s")
        if exposed is not None:
            summary["collective_wait_s"] = summary.get("collective_wait_s", 0.0) + exposed
        size = group_sizes.get(group)
        if size is None:
            continue
        for key, value in values.items():
            summed = _SUMMARY_KEYS.get((key, size), _NOT_YET)
            if summed is _NOT_YET:
                summed = _summary_key(key, size)
                if len(_SUMMARY_KEYS) < _SUMMARY_KEYS_MAX:
                    _SUMMARY_KEYS[(key, size)] = summed
            if summed is None:
                continue
            name, gathered = summed
            if gathered:
                # The row's is the gathered output (nccl-tests' size); the contract's, the input.
                value /= size
            summary[name] = summary.get(name, 0.0) + value
    return [(t, step, summary) for step, (t, summary) in sorted(steps.items()) if summary]


_TOTALS = ("collective_count", "collective_bytes")
#: A group row's key and its group's size -> the summary's name of it and whether it is an all_gather's bytes (None
#: for a key the summary leaves out); the most pairs kept. One lookup per key, not its name taken apart per row.
_SUMMARY_KEYS: dict[tuple[str, int], tuple[str, bool] | None] = {}
_SUMMARY_KEYS_MAX = 4096
_NOT_YET = object()


def _summary_key(key: str, size: int) -> tuple[str, bool] | None:
    """``coll.<op>.<size>.<field>`` for a row's ``collective_<op>_<field>`` (count, bytes, time_s), and whether its
    value is an all_gather's bytes; None for the totals, the sequence numbers, the arrival and the exposed wait."""
    if not key.startswith("collective_") or key in _TOTALS:
        return None
    if key.endswith("_time_s"):
        op, field = key[len("collective_") : -len("_time_s")], "time_s"
    elif key.endswith(("_count", "_bytes")):
        op, field = key[len("collective_") :].rsplit("_", 1)
    else:
        return None
    return f"coll.{op}.{size}.{field}", field == "bytes" and op == "all_gather"
