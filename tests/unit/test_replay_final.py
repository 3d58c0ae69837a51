"""The final snapshot of a replay comes from an engine that keeps no history (``NoHistory``): no snapshot reads the
history, so it is the snapshot, and the state, of the engine that keeps one."""

from __future__ import annotations

import msgspec
import pytest
from tm_runs import REPO

from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import NoHistory
from trainmeter_core.runlog import replay

FIXTURES = REPO / "tests" / "fixtures"
RUNS = sorted([*(FIXTURES / "golden").iterdir(), *(p for p in (FIXTURES / "real").iterdir() if p.is_dir())])


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_an_engine_without_a_history_ends_with_the_same_snapshot_and_state(run):
    kept, kept_snapshot = replay.replay_engine(run, use_checkpoint=False)
    bare, bare_snapshot = replay.replay_engine(run, use_checkpoint=False, keep_history=False)
    assert bare_snapshot is not None and kept_snapshot is not None
    assert msgspec.json.encode(bare_snapshot) == msgspec.json.encode(kept_snapshot)
    assert msgspec.msgpack.encode(bare.state) == msgspec.msgpack.encode(kept.state)
    # The one engine kept its points and the other none: the comparison above is not of two empty histories.
    assert len(kept.history.series_names()) > 5 and bare.history.series_names() == []
    assert msgspec.json.encode(replay.final_snapshot(run, use_checkpoint=False)) == msgspec.json.encode(
        kept_snapshot
    )


def test_an_engine_without_a_history_is_no_checkpoint():
    engine = Engine(history=NoHistory())
    with pytest.raises(ValueError, match="no checkpoint"):
        engine.state_bytes()
