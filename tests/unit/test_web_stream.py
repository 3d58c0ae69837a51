"""The live push: a whole document first, then JSON merge patches of what changed and new points at the page's
resolution."""

from __future__ import annotations

import copy

from live_run import feed

from trainmeter_core.model import records
from trainmeter_web.dashboard_state import DashboardState
from trainmeter_web.stream import LiveStream, merge_patch


def apply_patch(target: dict, patch: dict) -> dict:
    """RFC 7396 as the page applies it (app.js ``merge``)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            apply_patch(target[key], value)
        else:
            target[key] = value
    return target


def test_equal_documents_need_no_patch():
    assert merge_patch({"a": {"b": 1}}, {"a": {"b": 1}}) is None


def test_a_patch_carries_only_the_changed_leaves():
    old = {
        "metrics": {"mfu": {"value": 0.4, "unit": None, "convention": "titan"}, "ofu": {"value": 0.5}},
        "tick": 1,
    }
    new = {
        "metrics": {"mfu": {"value": 0.41, "unit": None, "convention": "titan"}, "ofu": {"value": 0.5}},
        "tick": 2,
    }
    assert merge_patch(old, new) == {"metrics": {"mfu": {"value": 0.41}}, "tick": 2}


def test_a_key_that_disappeared_is_null_and_a_new_one_is_sent_whole():
    old = {"metrics": {"mfu": {"value": 0.4}}}
    new = {"metrics": {"mfu": {"absent": "no peak"}}, "warnings": ["w"]}
    assert merge_patch(old, new) == {
        "metrics": {"mfu": {"value": None, "absent": "no peak"}},
        "warnings": ["w"],
    }


def test_a_value_that_changes_type_is_replaced():
    assert merge_patch({"a": 1}, {"a": 1.5}) == {"a": 1.5}
    assert merge_patch({"a": 1}, {"a": True}) == {"a": True}  # 1 == True, but the page must see the bool
    assert merge_patch({"a": {"b": 1}}, {"a": [1]}) == {"a": [1]}


def test_applying_the_patch_to_the_old_document_gives_the_new_one():
    old = {
        "s": {"m": {"a": {"value": 1.0, "low": 0.5}, "b": {"value": 2.0}}, "ranks": {"0": {"steps": 1}}},
        "x": [1],
    }
    new = {
        "s": {
            "m": {"a": {"value": 1.5}, "c": {"value": 3.0}},
            "ranks": {"0": {"steps": 2}, "1": {"steps": 1}},
        }
    }
    patched = apply_patch(copy.deepcopy(old), merge_patch(old, new))
    assert patched == new


def fed_model(steps: int) -> DashboardState:
    model = DashboardState()
    seq = 0
    for step in range(1, steps + 1):
        for record in (
            records.Step(step=step, tokens_global=10),
            records.Metric(values={"train_loss": 1.0 / step}, step=step),
        ):
            seq += 1
            record.seq, record.t, record.wall = seq, float(step), 1e9 + step
            feed(model, record)
    seq += 1
    feed(model, records.Tick(n=1, interval_s=1.0, seq=seq, t=float(steps), wall=1e9 + steps))
    return model


def feed_steps(model: DashboardState, first: int, last: int) -> None:
    seq = model.through_seq
    for step in range(first, last + 1):
        seq += 1
        feed(model, records.Metric(values={"train_loss": 1.0 / step}, step=step, seq=seq, t=float(step)))
    feed(model, records.Tick(n=last, interval_s=1.0, seq=seq + 1, t=float(last), wall=1e9 + last))


def test_the_first_event_holds_the_document_and_every_series_thinned_to_the_pages_points():
    model = fed_model(100)
    first = LiveStream(model, "step", points=20).full()
    assert first["x_axis"] == "step" and first["points"] == 20
    assert set(first["series"]) == set(first["doc"]["catalog"])
    loss = first["series"]["train_loss"]
    assert len(loss) == 20  # 100 points in groups of 5
    assert loss[0].count == 5 and loss[0].x == 5.0 and loss[-1].x == 100.0


def test_nothing_new_sends_nothing():
    model = fed_model(10)
    stream = LiveStream(model, "step", points=50)
    stream.full()
    assert stream.update() is None


def test_a_short_run_gets_every_new_point():
    model = fed_model(10)
    stream = LiveStream(model, "step", points=50)
    stream.full()
    feed_steps(model, 11, 12)
    event = stream.update()
    assert [p.x for p in event["series"]["train_loss"]] == [11.0, 12.0]
    assert event["doc"]["snapshot"]["tick"] == 12


def test_a_long_run_sends_a_point_only_once_the_series_grew_by_a_pages_pixel():
    model = fed_model(1000)
    stream = LiveStream(model, "step", points=100)
    stream.full()
    # 1000 points on 100 page points: a new page point per 10 server points
    feed_steps(model, 1001, 1005)
    assert "series" not in (stream.update() or {})
    feed_steps(model, 1006, 1010)
    points = stream.update()["series"]["train_loss"]
    assert len(points) == 1
    (point,) = points
    assert point.x == 1010.0 and point.count == 10
    assert point.min == 1.0 / 1010 and point.max == 1.0 / 1001  # the bucket keeps both ends of what it covers


def test_the_final_snapshot_flushes_what_is_left():
    model = fed_model(1000)
    stream = LiveStream(model, "step", points=100)
    stream.full()
    feed_steps(model, 1001, 1003)
    stream.update()
    feed(model, records.RunEnd(status=0, reason="exited", elapsed_s=1.0, seq=model.through_seq + 1, t=1004.0))
    event = stream.update()
    assert event["series"]["train_loss"][-1].x == 1003.0
    assert event["doc"]["status"]["state"] == "finished"


def test_a_series_that_appears_later_is_sent_whole():
    model = fed_model(5)
    stream = LiveStream(model, "step", points=50)
    stream.full()
    feed(model, records.Metric(values={"val_loss": 3.0}, step=5, seq=model.through_seq + 1, t=5.0))
    feed(model, records.Tick(n=2, interval_s=1.0, seq=model.through_seq + 2, t=6.0))
    event = stream.update()
    assert [p.value for p in event["series"]["val_loss"]] == [3.0]
    assert event["doc"]["catalog"]["val_loss"] == {"group": "loop", "raw_key": "val_loss"}
