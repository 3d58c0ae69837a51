"""The steady paths' gates: what each hot hook reads in one attribute instead of asking the agent's state each time.

A hot hook (the data wait, the model's forward, backward(), the optimizer step) may take its short way only while
nothing unusual holds: no probe stopped, no fault to inject, the agent said hello, the steps owned by the hooks, the
FLOP count over. Asked term by term, those checks were a tenth of what the agent added to an iteration of a tight
loop. Each state they are computed from is a ``gate_input``: setting it recomputes every gate (``Agent.regate``), so
no path can change the state and leave a gate behind. Nothing here reads a clock or touches torch.
"""

from __future__ import annotations

import operator


def gate_input(name: str, doc: str | None = None) -> property:
    """A plain attribute, read as one, whose every assignment recomputes the agent's gates: the owner's
    ``_regate()`` runs after the value is stored. Its value lives in the instance's attribute ``_gate_<name>``."""
    private = "_gate_" + name

    def set_value(self, value) -> None:
        # setattr, never self.__dict__: a dict taken from the instance leaves CPython's fast attribute paths for every
        # attribute of that object (3.11 keeps them inline until then), which cost the hot hooks more than the gates
        # saved.
        setattr(self, private, value)
        self._regate()

    # attrgetter: the read costs one C call, as a plain attribute costs none; only assignments run Python.
    return property(operator.attrgetter(private), set_value, doc=doc)
