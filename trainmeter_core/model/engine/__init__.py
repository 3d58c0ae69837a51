"""The engine: records in hub order in, a snapshot with every metric of the spec out on each ``tick`` and ``run.end``.
Its layers, top to bottom (pyproject.toml's ``engine-layers``): engine, snapshot, the metric families, attempts and
nodes, the snapshot builder, derived (what the facts imply), state, training_window."""

from trainmeter_core.model.engine.engine import Engine
from trainmeter_core.model.engine.snapshot import build_snapshot
from trainmeter_core.model.engine.state import STEP_WINDOW, EngineState, GpuState, RankState

__all__ = ["STEP_WINDOW", "Engine", "EngineState", "GpuState", "RankState", "build_snapshot"]
