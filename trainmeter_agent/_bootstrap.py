"""Installs the agent in a process: waits for the user's ``import torch`` (and trackers), and arranges the goodbye at
exit and a fresh start in fork children.

It runs (through ``trainmeter_agent._start``, which keeps the agent it makes) from sitecustomize before the user's
code runs, so it must be cheap (no zmq, msgspec or torch imported here) and never raise; torch is never imported by
tm, only watched for.
"""

from __future__ import annotations

import atexit
import os
import sys

from trainmeter_agent._agent import Agent
from trainmeter_agent._launcher_env import TRACKER_MODULES, listed_names


def _role() -> str:
    # A multiprocessing child that reaches here called emit itself (sitecustomize keeps them dormant).
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        return "worker"
    return "trainer"


def install() -> Agent | None:
    """Start an agent for this process: torch watch, atexit, fork handler. None where it could not start (said on
    stderr). The package's ``_start`` calls it once and keeps what it returns."""
    try:
        agent = Agent(os.environ["TM_AGENT_ENDPOINT"], role=_role())
        atexit.register(agent.at_exit)
        os.register_at_fork(before=agent.outbox.before_fork, after_in_child=agent.after_fork)
    except Exception as exc:
        try:
            sys.stderr.write(f"tm: agent stopped: {type(exc).__name__}: {' '.join(str(exc).split())}\n")
        except Exception:
            pass
        return None
    watch_torch(agent)
    return agent


def watch_torch(agent: Agent) -> None:
    """Attach the probes now if torch is imported, else once the user's ``import torch`` has finished; watch for the
    trackers the same way."""
    try:
        agent.check_fault("torch_import")
        agent.watcher.watch("torch", "torch_import", lambda torch: attach_torch_probes(agent, torch))
    except Exception as exc:
        agent.stop_probe("torch_import", exc)
    try:
        watch_trackers(agent)
    except Exception as exc:
        agent.stop_probe("taps", exc)


def watch_trackers(agent: Agent) -> None:
    """Watch the tracker modules; the taps load when the loop imports one (never with ``--no-tap``)."""
    if os.environ.get("TM_NO_TAP") == "1":
        return
    # A third-party tap named after its library (``aim``, ``comet_ml``) loads when that library is imported.
    listed = [name for name in listed_names() if name.isidentifier()]

    def tracker_imported(module) -> None:
        if agent.taps is None:
            from trainmeter_agent._tap_loader import TapLoader

            agent.taps = TapLoader(agent, agent.watcher)
        agent.taps.tracker_imported(module)

    for name in dict.fromkeys([*TRACKER_MODULES, *listed]):
        if name not in agent.watched_trackers:
            agent.watched_trackers.add(name)
            agent.watcher.watch(name, "taps", tracker_imported)


def attach_profiler(agent: Agent, profiler) -> None:
    from trainmeter_agent._profiler import attach

    attach(agent, profiler)


def _nothing(torch) -> None:
    pass


def attach_torch_probes(agent: Agent, torch) -> None:
    """The user's code has imported torch: the step hooks, then every probe that hangs off torch."""
    from trainmeter_agent._collectives import CollectiveProbe
    from trainmeter_agent._flops import FlopCount
    from trainmeter_agent._loss import LossProbe
    from trainmeter_agent._module_probe import ModelProbe
    from trainmeter_agent._phases import Phases

    agent.model = ModelProbe(agent)
    agent.flops = FlopCount(agent)
    agent.loss = LossProbe(agent)
    agent.phases = Phases(agent)
    agent.iterations.attach()
    if os.environ.get("TM_NO_COLLECTIVES") != "1":  # bench/bench_collectives.py measures with it off
        agent.collectives = CollectiveProbe(agent)
    phases = agent.phases
    for probe, attach in (
        ("model", agent.model.attach),
        ("data_wait", phases.attach_data_wait),
        ("checkpoint", phases.attach_torch_save),
        ("checkpoint", phases.attach_torch_load),
        ("compile", phases.attach_compile),
        ("loss", agent.loss.attach),
        ("collectives", agent.collectives.attach if agent.collectives is not None else _nothing),
    ):
        try:
            attach(torch)
        except Exception as exc:
            agent.stop_probe(probe, exc)
    agent.probe_state("eval", "not attached: the model was not seen yet")
    agent.probe_state("flops", "attached")
    watch = agent.watcher.watch
    watch("torch.profiler", "profiler", lambda profiler: attach_profiler(agent, profiler))
    watch("safetensors.torch", "checkpoint", phases.attach_safetensors)
    watch("torch.distributed.checkpoint", "checkpoint", phases.attach_dcp)
    watch("transformers.trainer", "eval", phases.attach_hf_trainer)
    watch("lightning.pytorch.loops.evaluation_loop", "eval", phases.attach_lightning)
    watch("pytorch_lightning.loops.evaluation_loop", "eval", phases.attach_lightning)
    # The launcher writes its plugin list right after the child starts: by now a listed library can be watched too.
    watch_trackers(agent)
