"""A training loop that resumed from a checkpoint: the agent's steps go on from the step its optimizer's restored state
holds, read once, before the process's first step, and never from a device."""

from __future__ import annotations

import pytest
from test_agent import HOOK_WAYS, detector_called, hooked_step


@pytest.fixture(params=HOOK_WAYS)
def detector(request):
    return detector_called(request.param)


def adamw_at_step(torch, steps: int):
    """An AdamW (and its model) trained ``steps`` steps, then both saved and loaded as a resumed loop does."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    resumed_model = torch.nn.Linear(2, 1)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed = torch.optim.AdamW(resumed_model.parameters(), lr=0.01)
    resumed.load_state_dict(checkpoint["optimizer"])
    return resumed_model, resumed


def test_a_loop_resumed_from_step_150_numbers_its_steps_151_on_and_says_where_from(detector, torch):
    model, optimizer = adamw_at_step(torch, 150)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        hooked_step(detector, optimizer)
    steps = detector.agent.steps
    assert [s["step"] for s in steps] == [151, 152, 153]
    assert steps[0]["resumed_from"] == 150 and all("resumed_from" not in s for s in steps[1:])
    assert detector.counted == 3  # the process's own iterations, for the probes that count them


def test_a_fresh_optimizer_starts_at_step_one(detector, torch):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        hooked_step(detector, optimizer)
    assert [(s["step"], "resumed_from" in s) for s in detector.agent.steps] == [(1, False), (2, False)]


def test_an_optimizer_without_a_step_in_its_state_gives_no_resumed_step(detector, torch):
    model = torch.nn.Linear(2, 1)
    trained = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    trained.step()  # SGD's state holds its momentum buffers, no step
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.load_state_dict(trained.state_dict())
    model(torch.ones(1, 2)).sum().backward()
    hooked_step(detector, optimizer)
    assert [(s["step"], "resumed_from" in s) for s in detector.agent.steps] == [(1, False)]


def test_a_step_taken_with_a_closure_is_numbered_from_the_state_before_it(detector, torch):
    model, optimizer = adamw_at_step(torch, 20)

    def closure():
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    for _ in range(2):
        detector.pre_hook(optimizer, (optimizer, closure), {})
        optimizer.step(closure)
        detector.post_hook(optimizer, (optimizer, closure), {})
    assert [s["step"] for s in detector.agent.steps] == [21, 22]
    assert detector.agent.steps[0]["resumed_from"] == 20


def test_a_step_kept_on_a_device_is_never_read(torch):
    from trainmeter_agent._iterations import restored_step

    model, optimizer = adamw_at_step(torch, 5)
    for state in optimizer.state.values():
        # where a fused or capturable optimizer keeps it; reading a meta tensor's value would raise
        state["step"] = torch.empty((), device="meta")
    assert restored_step(optimizer) is None
    for state in optimizer.state.values():
        state["step"] = 7  # an optimizer that keeps a plain number
    assert restored_step(optimizer) == 7
