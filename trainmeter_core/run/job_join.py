"""Joining a job of several nodes: node rank 0's hub listens for the other nodes (tcp, CURVE, with a new key for the
job), every other node's hub forwards to it. A job that cannot be joined is said in one line, and the run goes on alone
with its complete local log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from trainmeter_core.bus.hub import Hub
from trainmeter_core.run import job_discovery
from trainmeter_core.run.stderr_lines import Say

if TYPE_CHECKING:
    from trainmeter_core.run.job_discovery import JobPlan
    from trainmeter_core.run.run_options import RunOptions


def join_job(opts: RunOptions, hub: Hub, run_dir: Path, say: Say) -> JobPlan | None:
    """Find this run's place in a job of several nodes and set the hub up for it: node rank 0 listens for the other
    nodes, every other node forwards to it. None for a single-node run, or when the job cannot be joined (said in one
    line; the run then goes on alone, with its complete local log)."""
    try:
        plan = job_discovery.discover(
            opts.command,
            os.environ,
            job=opts.job,
            node_rank=opts.node_rank,
            nnodes=opts.nnodes,
            keys_dir=opts.job_keys,
        )
        if plan is None:
            return None
        if plan.place.node_rank == 0:
            _listen(plan, hub, say)
        else:
            _forward(plan, hub, run_dir, say)
    except job_discovery.JobUnjoinable as exc:
        say(f"{exc}; this run goes on alone", always=True)
        return None
    return plan


def _listen(plan: JobPlan, hub: Hub, say: Say) -> None:
    """Node rank 0: the job hub listens (tcp, CURVE, with a new key for the job) on the first address it can bind."""
    from trainmeter_core.bus import jobkeys

    place = plan.place
    try:
        keys = jobkeys.create(plan.keys_dir, place.id)
    except jobkeys.JobKeysError as exc:
        raise job_discovery.JobUnjoinable(str(exc)) from None
    errors = []
    for endpoint in job_discovery.bind_endpoints(plan):
        try:
            bound = hub.listen_job(endpoint, keys, place.nnodes, lambda line: say(line, always=True))
            break
        except Exception as exc:  # zmq.ZMQError: the address is not this node's, or the port is taken
            errors.append(f"{endpoint}: {exc}")
    else:
        raise job_discovery.JobUnjoinable(
            f"the job hub cannot listen ({'; '.join(errors)}): pass --job HOST:PORT"
        )
    say(
        f"job {place.id} ({place.found_by}): node 0 of {place.nnodes}, the job hub listens on {bound} "
        f"(CURVE; keys in {plan.keys_dir})",
        always=True,
    )


def _forward(plan: JobPlan, hub: Hub, run_dir: Path, say: Say) -> None:
    """Every other node: its hub forwards what it records to the job hub."""
    from trainmeter_core.bus.forward import Forwarder

    place = plan.place
    hub.forwarder = Forwarder(
        plan.connect_endpoint,
        plan.keys_dir,
        place.node_rank,
        run_dir.name,
        say=lambda line: say(line, always=True),
        notice=hub.inject,
    )
    hub.forwarder.start()
    say(
        f"job {place.id} ({place.found_by}): node {place.node_rank} of {place.nnodes}, forwarding to "
        f"{plan.connect_endpoint} (CURVE; keys from {plan.keys_dir})",
        always=True,
    )
