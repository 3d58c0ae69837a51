"""Whether torch.compile or torch.export is tracing the code that calls a probe right now.

The model's hook and the loss probe ask on every forward and backward, so a process that has not called torch.compile
asks with one C call; once it has, the probes ask torch's own ``is_compiling()``, which dynamo knows by name.
"""

from __future__ import annotations

import functools


def eager_check(torch):
    """The check for a process that has not called torch.compile: torch.compiler's flag read by ``getattr`` (no Python
    frame). ``torch.compiler.is_compiling()`` is two Python calls that return the same flag outside TorchScript;
    dynamo holds it while it compiles, and export while it traces. A torch without the flag gets ``full_check``."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        return functools.partial(getattr, compiler, "_is_compiling_flag")
    return full_check(torch)


def eager_flag_holder(torch):
    """``torch.compiler`` where it holds the flag ``eager_check`` reads (a short way reads the attribute itself), or
    None."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        return compiler
    return None


def full_check(torch):
    """torch's ``torch.compiler.is_compiling`` (a torch without it never compiles: always False)."""
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)
