"""Installs the agent in a process: waits for the user's ``import torch``, and arranges the goodbye at exit and a
fresh start in fork children.

It is called from sitecustomize before the user's code runs, so it must be cheap (no zmq, msgspec or torch
imported here) and never raise; torch is never imported by tm, only watched for.
"""

from __future__ import annotations

import atexit
import os
import sys

import trainmeter_agent
from trainmeter_agent._agent import Agent


def _role() -> str:
    # A multiprocessing child that reaches here called emit itself (sitecustomize keeps them dormant).
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        return "worker"
    return "trainer"


def install() -> Agent | None:
    """Start the process's agent (once): torch watch, atexit, fork handler. None where it could not start."""
    if trainmeter_agent._process_agent is not None:
        return trainmeter_agent._process_agent
    if trainmeter_agent._disabled:
        return None
    try:
        agent = Agent(os.environ["TM_AGENT_ENDPOINT"], role=_role())
        trainmeter_agent._process_agent = agent
        atexit.register(agent.at_exit)
        os.register_at_fork(after_in_child=agent.after_fork)
    except Exception as exc:
        trainmeter_agent._process_agent = None
        trainmeter_agent._disabled = True
        try:
            sys.stderr.write(f"tm: agent stopped: {type(exc).__name__}: {' '.join(str(exc).split())}\n")
        except Exception:
            pass
        return None
    watch_torch(agent)
    return agent


def watch_torch(agent: Agent) -> None:
    """Attach the step probe now if torch is imported, else once the user's ``import torch`` has finished."""
    try:
        agent.check_fault("torch_import")
        torch = sys.modules.get("torch")
        spec = getattr(torch, "__spec__", None)
        if torch is not None and not getattr(spec, "_initializing", False):
            agent.iterations.attach()
            return
        sys.meta_path.insert(0, TorchImportWatcher(agent))
    except Exception as exc:
        agent.stop_probe("torch_import", exc)


class TorchImportWatcher:
    """A ``sys.meta_path`` finder that lets the other finders find torch and wraps the loader it gets.

    The wrapped ``exec_module`` runs torch's own first, untouched (its errors are the user's), then attaches the
    step probe. The watcher leaves ``sys.meta_path`` as soon as torch is found.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._searching = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self._searching:
            return None
        try:
            self._searching = True
            try:
                spec = None
                for finder in list(sys.meta_path):
                    find = getattr(finder, "find_spec", None)
                    if finder is self or find is None:
                        continue
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
            finally:
                self._searching = False
            if spec is None:
                return None  # not installed: the import fails as it would without tm
            self._leave()
            loader = spec.loader
            original = getattr(loader, "exec_module", None)
            if original is None:
                return None
            loader.exec_module = self._wrap(loader, original)
            return spec
        except Exception as exc:
            self._leave()
            self.agent.stop_probe("torch_import", exc)
            return None

    def _leave(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def _wrap(self, loader, original):
        agent = self.agent

        def exec_module(module):
            if getattr(module, "__name__", None) != "torch":
                return original(module)
            try:
                del loader.exec_module  # back to the loader's own method: a reload is not watched again
            except AttributeError:
                pass
            original(module)
            try:
                agent.iterations.attach()
            except Exception as exc:
                agent.stop_probe("torch_import", exc)

        return exec_module
