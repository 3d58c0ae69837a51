"""trainmeter's in-process agent; ``from trainmeter_agent import emit`` is the one API a training loop needs.

Importing this package must stay cheap (no zmq, msgspec or torch), and ``emit`` must never raise into the loop and
never convert an accelerator tensor: outside tm it is a no-op, inside it queues numbers for the run's bus.
"""

import os

__all__ = ["emit"]

# Inside a run the launcher sets both; with ``--no-agent`` TM_AGENT is absent or "0" and emit stays a no-op.
_ENABLED = os.environ.get("TM_AGENT") == "1" and bool(os.environ.get("TM_AGENT_ENDPOINT"))
#: The process's agent, set by ``_start`` (from sitecustomize, or from the first emit in a process where
#: sitecustomize stayed dormant or never ran).
_process_agent = None
#: Set once starting the agent failed (and said so on stderr): emit is then a no-op for the rest of the process.
_disabled = False


def emit(**values: object) -> None:
    """Report numbers from the training loop: ``emit(train_loss=loss.item(), lr=lr)``.

    Values are real numbers: ints, floats, bools or 0-dim CPU tensors (``_real_number``, the rule the tracker taps
    share). Any other value is skipped alone, with one ``tm:`` line naming its key; a tensor on another device is
    never read (the line asks for ``.item()``). ``emit(step=..., tokens=...)`` declares a training step for loops the
    agent cannot see (no ``torch.optim`` optimizer). Outside ``tm`` this is a no-op; it never raises.
    """
    agent = _process_agent
    if agent is None:
        if not _ENABLED or _disabled:
            return
        agent = _start_from_emit()
        if agent is None:
            return
    agent.emit(values)


def _start():
    """The process's agent, started once (``_bootstrap.install``); None where it could not start, and from then on.
    An import error of the agent's own modules reaches the caller (sitecustomize says it on stderr)."""
    global _process_agent, _disabled
    if _process_agent is not None:
        return _process_agent
    if _disabled:
        return None
    from trainmeter_agent import _bootstrap

    _process_agent = _bootstrap.install()
    _disabled = _process_agent is None
    return _process_agent


def _start_from_emit():
    global _disabled
    try:
        return _start()
    except Exception:
        _disabled = True
        return None
