"""The engine: records in hub order in, a snapshot with every metric of the spec out on each ``tick`` and ``run.end``."""

from trainmeter_core.model.engine.feed import (
    STEP_WINDOW,
    Engine,
    EngineState,
    GpuState,
    RankState,
    build_snapshot,
)

__all__ = ["STEP_WINDOW", "Engine", "EngineState", "GpuState", "RankState", "build_snapshot"]
