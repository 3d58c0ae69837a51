"""The steady paths' gates (trainmeter_agent/_gates.py): each state a hot hook's short way depends on closes that way
when it changes, and only that way; the ways open again when it changes back. No torch: the probes are built bare."""

from __future__ import annotations

import weakref

import pytest

from trainmeter_agent._agent import Agent, InjectedFault
from trainmeter_agent._flops import FlopCount
from trainmeter_agent._gates import gate_input
from trainmeter_agent._loss import ATTACHED, LossProbe
from trainmeter_agent._module_probe import ModelProbe
from trainmeter_agent._phases import Phases


class Model:
    """Stands in for the adopted model (the probe keeps a weak reference to it)."""


def bare_agent(monkeypatch, faults: str = "") -> Agent:
    """An agent with its torch probes built, as torch's import builds them, and nothing seen yet."""
    monkeypatch.setenv("TM_AGENT_FAULT", faults)
    agent = Agent("ipc:///nonexistent/in")
    agent.model, agent.flops, agent.loss, agent.phases = (
        ModelProbe(agent),
        FlopCount(agent),
        LossProbe(agent),
        Phases(agent),
    )
    return agent


def steady_agent(monkeypatch, faults: str = "") -> tuple[Agent, Model]:
    """An agent in the state of a steady loop: hello said, the model adopted with its dp and sequence length, the FLOP
    count over, the loss attached, a DataLoader batch seen, the steps the optimizer hooks' own."""
    agent = bare_agent(monkeypatch, faults)
    model = Model()
    agent.activated = True
    agent.model.eager = agent.loss.eager = True  # torch.compile never called
    agent.model.root_ref, agent.model.dp, agent.model.seq_len_sent = weakref.ref(model), 1, True
    agent.flops.done = True
    agent.loss._said = ATTACHED
    agent.phases.data_seen = True
    agent._step_owner = "hooks"
    return agent, model


def ways(agent: Agent) -> dict[str, bool]:
    """Which short ways are open: the data wait's, the model's forward, backward(), the steady step and its loss, the
    optimizer hooks' lane."""
    return {
        "data": agent.phases.fast,
        "model": agent.model.fast,
        "loss": agent.loss.fast,
        "step": agent.iterations.steady,
        "step_loss": agent._steady_loss is agent.loss,
        "lane": agent.iterations.lane_on,
    }


ALL_OPEN = dict.fromkeys(["data", "model", "loss", "step", "step_loss", "lane"], True)


def test_a_steady_loop_opens_every_short_way(monkeypatch):
    agent, _ = steady_agent(monkeypatch)
    assert ways(agent) == ALL_OPEN


def test_a_fresh_agent_opens_none(monkeypatch):
    agent = bare_agent(monkeypatch)
    # Only the lane's own switch is on: its hooks are attached and count (the lane is chosen per optimizer).
    assert ways(agent) == {**dict.fromkeys(ALL_OPEN, False), "lane": True}


def _stop(agent: Agent, probe: str) -> None:
    agent.stop_probe(probe, RuntimeError("test"))


# Each change, and the ways it closes (every other one stays open).
CHANGES = {
    "the data wait stopped": (lambda a: _stop(a, "data_wait"), {"data"}),
    "the model probe stopped": (lambda a: _stop(a, "model"), {"model", "step", "step_loss"}),
    "the loss probe stopped": (lambda a: _stop(a, "loss"), {"loss", "step_loss"}),
    "the steps probe stopped": (lambda a: _stop(a, "steps"), {"lane"}),
    "torch.compile called": (lambda a: setattr(a.model, "eager", False), {"model"}),
    "torch.compile called (the loss)": (lambda a: setattr(a.loss, "eager", False), {"loss"}),
    "the FLOP count started": (
        lambda a: (setattr(a.flops, "done", False), setattr(a.flops, "_started_step", 2)),
        {"model", "step", "step_loss"},
    ),
    "the FLOP count still to come": (lambda a: setattr(a.flops, "done", False), {"model"}),
    "the steps are the loop's own (emit)": (
        lambda a: setattr(a, "_step_owner", "emit"),
        {"data", "loss", "step", "step_loss"},
    ),
    "no hello said": (lambda a: setattr(a, "activated", False), {"data"}),
    "no DataLoader batch seen": (lambda a: setattr(a.phases, "data_seen", False), {"data"}),
    "the model let go": (lambda a: setattr(a.model, "root_ref", None), {"step", "step_loss"}),
    "no dp known": (lambda a: setattr(a.model, "dp", None), {"step", "step_loss"}),
    "the sequence length not said": (lambda a: setattr(a.model, "seq_len_sent", False), {"model"}),
    "the loss said not attached": (lambda a: setattr(a.loss, "_said", "not attached: x"), {"step_loss"}),
    "the loss probe off": (lambda a: setattr(a.loss, "on", False), {"loss", "step_loss"}),
    "the model probe off": (lambda a: setattr(a.model, "on", False), {"model"}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_state_closes_its_short_ways_and_only_those(monkeypatch, change):
    agent, _ = steady_agent(monkeypatch)
    apply, closed = CHANGES[change]
    apply(agent)
    assert ways(agent) == {way: way not in closed for way in ALL_OPEN}


def test_a_fault_to_inject_closes_every_way_until_it_is_used(monkeypatch):
    agent, _ = steady_agent(monkeypatch, faults="emit")
    assert ways(agent) == {**dict.fromkeys(ALL_OPEN, False), "lane": True}
    with pytest.raises(InjectedFault):
        agent.check_fault("emit")
    assert ways(agent) == ALL_OPEN


def test_the_general_way_for_every_iteration_closes_every_short_way(monkeypatch):
    agent, _ = steady_agent(monkeypatch)
    monkeypatch.setattr(Agent, "lean", False)
    agent.regate()
    assert ways(agent) == {**dict.fromkeys(ALL_OPEN, False), "lane": True}


def test_the_ways_open_again_when_the_state_changes_back(monkeypatch):
    agent, _ = steady_agent(monkeypatch)
    agent._step_owner = "emit"
    agent.model.seq_len_sent = False
    agent._step_owner = "hooks"
    agent.model.seq_len_sent = True
    assert ways(agent) == ALL_OPEN


def test_a_gate_input_reads_as_the_value_set_and_recomputes_the_gates_on_each_assignment():
    class Owner:
        state = gate_input("state")

        def __init__(self) -> None:
            self.regates = 0

        def _regate(self) -> None:
            self.regates += 1

    owner = Owner()
    owner.state = "a"
    owner.state = "a"
    assert owner.state == "a" and owner.regates == 2
    assert vars(owner) == {"regates": 2, "_gate_state": "a"}
