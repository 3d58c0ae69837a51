"""The engine: records in hub order in, a snapshot with every metric of the spec out on each ``tick`` and ``run.end``.

Layers, top to bottom (pyproject.toml's ``engine-layers`` contract): the engine, the snapshot, the metric families,
the snapshot builder, the values the facts imply (``derived``), the state, the training window."""

from trainmeter_core.model.engine.engine import Engine
from trainmeter_core.model.engine.snapshot import build_snapshot
from trainmeter_core.model.engine.state import STEP_WINDOW, EngineState, GpuState, RankState

__all__ = ["STEP_WINDOW", "Engine", "EngineState", "GpuState", "RankState", "build_snapshot"]
