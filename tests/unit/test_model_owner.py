"""Which module is the model (trainmeter_agent/_model_owner.py), on stand-ins for torch modules and an optimizer: the
module that holds every parameter the optimizer steps, found among the modules on the call stack at adoption."""

from __future__ import annotations

import sys

from trainmeter_agent._model_owner import owner, stack_candidates


class Param:
    """A parameter: only its identity matters here."""


class Module:
    """What _model_owner reads of an nn.Module: its children, named_modules, modules and parameters."""

    def __init__(self, n_params: int = 0, **children: Module) -> None:
        self._params = [Param() for _ in range(n_params)]
        self._modules = dict(children)

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return (module for _, module in self.named_modules())

    def __getattr__(self, name: str) -> Module:
        try:
            return self.__dict__["_modules"][name]
        except KeyError:
            raise AttributeError(name) from None

    def parameters(self):
        return (param for module in self.modules() for param in module._params)


class Optimizer:
    def __init__(self, *modules: Module) -> None:
        self.param_groups = [{"params": [p for m in modules for p in m.parameters()]}]


def test_a_module_holding_every_stepped_parameter_is_the_model_as_it_is():
    model = Module(1, embed=Module(1), head=Module(2))
    # Fine-tuning steps only the head: the module first called still holds it, so it stays the model.
    assert owner(model, [], Optimizer(model.head)) == (None, [])
    assert owner(model, [], Optimizer(model)) == (None, [])


def test_the_optimizer_of_another_network_leaves_the_model_as_it_is():
    generator, discriminator = Module(2), Module(3)
    assert owner(generator, [], Optimizer(discriminator)) == (None, [])


def test_the_smallest_candidate_that_holds_every_stepped_parameter_is_the_model():
    net = Module(0, embed=Module(1), head=Module(2))
    outer = Module(0, net=net, ema=Module(3))  # a LightningModule holding the net and an EMA copy of it
    candidates = stack_candidates((net.embed,), Module, _frame_holding(outer))
    found, missing = owner(net.embed, candidates, Optimizer(net))
    assert found is net and missing == []


def test_no_module_holding_them_all_gives_the_stepped_parameters_outside_the_first_module():
    embed, head = Module(1), Module(2)
    found, missing = owner(embed, [], Optimizer(embed, head))
    assert found is None and missing == list(head.parameters())


def test_the_call_stack_gives_a_frames_self_its_locals_and_a_trainers_modules():
    net = Module(0, embed=Module(1), head=Module(2))

    class Trainer:
        def __init__(self) -> None:
            self.model = net

        def step(self):
            return stack_candidates((net.embed,), Module, sys._getframe())

    found = [ref() for ref in Trainer().step()]
    assert net in found and net.embed not in found


def test_a_module_that_does_not_hold_the_adopted_one_is_no_candidate():
    lonely, unrelated = Module(1), Module(4)
    assert stack_candidates((lonely,), Module, _frame_holding(unrelated)) == []


def _frame_holding(module: Module):
    holder = module  # a local of this frame, as a training loop's ``model``
    assert holder is module
    return sys._getframe()
