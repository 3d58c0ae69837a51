"""What the facts imply, in one object the engine and every metric family read: the rig, FLOPs per token, tokens per
step, the data-parallel size, the facts' warnings, and the x values (step, tokens, FLOPs spent) of a history point.
Derived, never state: recomputed only when a fact changed, so a checkpoint never holds it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainmeter_core.model.facts import ModelFlops, model_flops, whole
from trainmeter_core.model.rig import ClockBasis, Rig, ofu_clock, resolve_rig

if TYPE_CHECKING:
    from trainmeter_core.model.engine.state import EngineState

#: Beyond any real batch (2**40 tokens in one step); a larger count is a broken emitter's, and would overflow the sums.
MAX_TOKENS_PER_STEP = 2**40
_NAN = math.nan
#: The most answers ``Derived.ofu_clock`` keeps (a GPU's max SM clock seldom changes: a few per GPU of a job).
_OFU_CLOCKS_MAX = 4096


class Derived:
    """The values the facts imply, for one engine's state; ``refresh`` brings them up to date with its facts.

    ``x_flop_per_token`` is the FLOPs per token the FLOPs-spent axis uses: the value under the chosen convention, NaN
    without one (a range has no single x). Of a ``tokens_per_step`` fact, a declared one (``--tokens-per-step``) is
    ``declared_tokens_per_step`` and any other ``other_tokens_per_step``; either is None when absent or absurd.
    """

    __slots__ = (
        "declared_tokens_per_step",
        "dp",
        "fact_warnings",
        "facts_version",
        "flops",
        "ofu_clocks",
        "other_tokens_per_step",
        "rig",
        "state",
        "x_flop_per_token",
    )

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.facts_version = -1  # the facts' version these values reflect: none yet
        self.rig = Rig()
        self.flops = ModelFlops()
        self.x_flop_per_token = _NAN
        self.declared_tokens_per_step: int | None = None
        self.other_tokens_per_step: int | None = None
        self.dp: int | None = None  # the declared data-parallel degree
        self.fact_warnings: list[str] = []
        # ofu_clock's answers for this rig, by sampled GPU and its max SM clock (emptied with the rig)
        self.ofu_clocks: dict[tuple[str, float | None], tuple[ClockBasis | None, str | None]] = {}

    def refresh(self) -> Derived:
        """Up to date with the state's facts (recomputed only when a fact changed); returns itself."""
        state = self.state
        facts = state.facts
        if facts.version != self.facts_version:
            self.facts_version = facts.version
            visible = {host: tuple(entries) for host, entries in state.visible_devices.items()}
            self.rig = resolve_rig(facts, visible)
            self.ofu_clocks = {}
            flops = self.flops = model_flops(facts)
            self.fact_warnings = facts.warnings()
            self.x_flop_per_token = flops.value if flops.value is not None else _NAN
            declared = facts.get("tokens_per_step")
            tokens = whole(declared.value) if declared is not None else None
            tokens = tokens if tokens is not None and 0 < tokens < MAX_TOKENS_PER_STEP else None
            is_declared = declared is not None and declared.provenance == "declared"
            self.declared_tokens_per_step = tokens if is_declared else None
            self.other_tokens_per_step = None if is_declared else tokens
            dp = whole(facts.value("dp"))
            self.dp = dp if dp is not None and 1 <= dp < MAX_TOKENS_PER_STEP else None
        return self

    def ofu_clock(self, key: str, clock_sm_max_mhz: float | None) -> tuple[ClockBasis | None, str | None]:
        """``rig.ofu_clock`` for the sampled GPU ``key`` (``host/gpuN``) of the current rig, worked out once per GPU and
        max SM clock: it builds its words each time (2 µs), and a GPU sample asks for it, as each snapshot does."""
        memo = (key, clock_sm_max_mhz)
        answer = self.ofu_clocks.get(memo)
        if answer is None:
            if len(self.ofu_clocks) >= _OFU_CLOCKS_MAX:
                self.ofu_clocks.clear()  # a sampler reporting a new max clock each time: never a growing memo
            answer = self.ofu_clocks[memo] = ofu_clock(self.rig.sampled.get(key), clock_sm_max_mhz)
        return answer

    def x(self) -> tuple[float, float, float]:
        """The step, tokens and FLOPs-spent x values of a point recorded now (NaN for one not known yet)."""
        state = self.state
        if self.facts_version != state.facts.version:
            self.refresh()  # a restored engine derives on first use, so its x values match a continuous one
        step = float(state.last_step) if state.last_step is not None else _NAN
        if state.steps_with_tokens:
            return step, float(state.tokens_seen), state.tokens_seen * self.x_flop_per_token
        return step, _NAN, _NAN
