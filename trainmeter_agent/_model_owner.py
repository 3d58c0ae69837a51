"""Which module is the model: the one that holds every parameter the optimizer steps, decided once, at the first step.

The model probe adopts the first module called outermost in training (``_module_probe.py``). A training step that
calls submodules one by one (a LightningModule's ``training_step`` calling ``self.embed(x)`` then ``self.head(h)``)
makes that the first submodule alone: an embedding table, whose parameters are all lookups. So, when the module is
adopted, the modules on the call stack that hold it are kept as candidates (weak references); at the first optimizer
step, where the adopted module holds only part of what the optimizer steps, the smallest candidate that holds it all
is the model. This runs once in a process, never per iteration; it reads no tensor's value.
"""

from __future__ import annotations

import weakref

#: How many frames above the adopting call are looked at: a Lightning ``training_step`` sits about a dozen below.
STACK_DEPTH = 40


def _ancestors(candidate, adopted: tuple) -> list:
    """``candidate`` and its submodules on the way down to the adopted module, or [] where it does not hold it."""
    for name, sub in candidate.named_modules():
        if any(sub is module for module in adopted):
            chain = [candidate]
            module = candidate
            for part in name.split(".")[:-1] if name else ():
                module = module._modules[part]
                chain.append(module)
            return chain
    return []


def stack_candidates(adopted: tuple, module_type: type, frame) -> list[weakref.ref]:
    """Modules that hold the adopted module (or what it wraps), found from the call stack, ``frame`` up: each frame's
    ``self``, its other locals (a script's globals) and the attributes of a ``self`` that is no module (a trainer
    object that holds the model); with each, its submodules on the way down to the adopted one."""
    found: list[weakref.ref] = []
    seen = {id(module) for module in adopted}
    for _ in range(STACK_DEPTH):
        if frame is None:
            break
        try:
            _frame_candidates(frame, adopted, module_type, seen, found)
        except Exception:  # the user's objects: one whose locals or attributes cannot be read is passed over
            pass
        frame = frame.f_back
    return found


def _frame_candidates(frame, adopted: tuple, module_type: type, seen: set[int], found: list) -> None:
    # A dict before Python 3.13, a mapping proxy of the frame since: either reads as a dict.
    names = dict(frame.f_locals)
    values = list(names.values())
    owner = names.get("self")
    if owner is not None and not isinstance(owner, module_type):
        attributes = getattr(owner, "__dict__", None)
        if isinstance(attributes, dict):
            values.extend(attributes.values())
    for value in values:
        if isinstance(value, module_type) and id(value) not in seen:
            seen.add(id(value))
            for module in _ancestors(value, adopted):
                if module is value or id(module) not in seen:
                    seen.add(id(module))
                    found.append(weakref.ref(module))


def stepped_parameters(optimizer) -> list:
    """The parameters an optimizer steps, each once, in its groups' order."""
    params = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            params[id(param)] = param
    return list(params.values())


def owner(adopted, candidates: list[weakref.ref], optimizer) -> tuple[object | None, list]:
    """(the model, parameters it misses) where the adopted module holds only part of what ``optimizer`` steps.

    ``(None, [])``: the adopted module is the model, for it holds every stepped parameter (frozen ones of its own stay
    its own), or the optimizer steps none of its parameters (another model's: a GAN's other network). ``(module, [])``:
    the smallest candidate that holds every stepped parameter. ``(None, params)``: no module seen holds them all; the
    model is then the adopted module and the stepped ``params`` it lacks.
    """
    stepped = stepped_parameters(optimizer)
    own = {id(param) for param in adopted.parameters()}
    outside = [param for param in stepped if id(param) not in own]
    if not outside or len(outside) == len(stepped):
        return None, []
    best = None
    for ref in candidates:
        candidate = ref()
        if candidate is None:
            continue
        held = {id(param) for param in candidate.parameters()}
        if all(id(param) in held for param in outside) and (best is None or len(held) < best[0]):
            best = (len(held), candidate)
    if best is not None:
        return best[1], []
    return None, outside
