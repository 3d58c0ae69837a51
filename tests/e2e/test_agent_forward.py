"""The model probe's ``forward`` on the model (trainmeter_agent/_forward.py): it sees every forward of the model it was
set on, and nothing of it leaves with a copy, a pickle or a DataParallel replica of the model."""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import warnings

import pytest


class SeenForwards:
    """Stands in for the model probe: records what each forward got."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, tuple, dict]] = []
        self.fast = False  # no short way: every forward reaches _pre_hook

    def _pre_hook(self, module, args, kwargs) -> None:
        self.seen.append((module, args, kwargs))


@pytest.fixture
def watched(torch):
    from trainmeter_agent._forward import can_set_forward, set_forward

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
    probe = SeenForwards()
    assert can_set_forward(model, torch)
    handle = set_forward(probe, model, torch)
    return model, probe, handle


def test_each_call_and_each_direct_forward_is_seen_with_its_arguments_and_the_result_is_the_models(
    watched, torch
):
    model, probe, _ = watched
    ids = torch.randint(16, (2, 8))
    expected = torch.nn.Sequential.forward(model, ids)
    assert torch.equal(model(ids), expected)
    assert torch.equal(model.forward(ids), expected)
    assert [(m, a) for m, a, _ in probe.seen] == [(model, (ids,)), (model, (ids,))]
    # nn.Module.__call__ stays on its fast path: no hook of any kind on the model.
    assert not (model._forward_pre_hooks or model._forward_hooks)


def test_it_reads_as_the_bound_method_it_stands_for(watched, torch):
    model, _, _ = watched
    plain = torch.nn.Sequential.forward.__get__(model)
    assert model.forward.__self__ is model and model.forward.__func__ is torch.nn.Sequential.forward
    assert inspect.signature(model.forward) == inspect.signature(plain)  # what the HF Trainer reads
    # Every other attribute of the function, as the bound method reads it (torch.export reads __code__).
    assert model.forward.__code__ is plain.__code__ and model.forward.__name__ == plain.__name__
    with pytest.raises(AttributeError):
        _ = model.forward.no_such_attribute


def test_once_the_model_is_gone_its_forward_reads_nothing_of_the_function(torch):
    from trainmeter_agent._forward import ModelForward

    model = torch.nn.Linear(2, 2)
    forward = ModelForward(SeenForwards(), model)
    assert forward.__code__ is torch.nn.Linear.forward.__code__
    del model
    with pytest.raises(AttributeError):
        _ = forward.__code__


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_a_copy_or_a_pickle_of_the_model_has_its_classs_own_forward(watched, torch, how):
    model, probe, _ = watched
    if how == "copy":
        other = copy.copy(model)
    elif how == "deepcopy":
        other = copy.deepcopy(model)
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        other = torch.load(buffer, weights_only=False)
    assert "forward" not in other.__dict__ and "forward" in model.__dict__
    other(torch.randint(16, (2, 8)))
    assert probe.seen == []  # the copy's forwards are not the model's


def test_a_dataparallel_replica_has_its_classs_own_forward(watched, torch):
    model, probe, _ = watched
    replica = model._replicate_for_data_parallel()
    assert "forward" not in replica.__dict__
    replica(torch.randint(16, (2, 8)))
    assert probe.seen == []


def test_a_class_whose_own_getstate_keeps_it_still_copies_to_a_forward_of_the_copy(torch):
    from trainmeter_agent._forward import set_forward

    class KeepsAll(torch.nn.Linear):
        def __getstate__(self):
            return self.__dict__  # no call to nn.Module's: the probe's forward is in what it returns

    KeepsAll.__qualname__ = "KeepsAll"
    globals()["KeepsAll"] = KeepsAll  # where pickle looks for the class by its name
    torch.manual_seed(0)
    model, probe = KeepsAll(4, 4), SeenForwards()
    set_forward(probe, model, torch)
    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.weight.zero_()
        copied.bias.zero_()
    x = torch.ones(1, 4)
    assert torch.equal(copied(x), torch.zeros(1, 4))  # the copy computed with its own (zeroed) weights
    assert probe.seen == []
    pickled = pickle.loads(pickle.dumps(model))  # loads with the class's forward, bound to the loaded model
    assert pickled.forward.__self__ is pickled and torch.equal(pickled(x), model(x))


def test_the_handle_gives_the_model_its_classs_forward_back(watched, torch):
    model, probe, handle = watched
    handle.remove()
    assert "forward" not in model.__dict__
    model(torch.randint(16, (2, 8)))
    assert probe.seen == []
    handle.remove()  # twice is harmless


def test_a_model_with_a_forward_of_its_own_or_torchscript_is_hooked_instead(torch):
    from trainmeter_agent._forward import can_set_forward

    model = torch.nn.Linear(4, 4)
    model.forward = model.forward  # what accelerate's autocast wrapper does: a forward on the model itself
    assert not can_set_forward(model, torch)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # torch 2.13 deprecates TorchScript; it still runs
        scripted = torch.jit.script(torch.nn.Linear(4, 4))
    assert not can_set_forward(scripted, torch)
