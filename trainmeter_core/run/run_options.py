"""What ``tm`` was asked to run and how: the command and the run options of its command line, as one value the
launcher and its helpers read (``commands/cli.py`` builds it). A leaf: it imports nothing of tm.
"""

from __future__ import annotations

import msgspec


class RunOptions(msgspec.Struct):
    command: list[str]
    script_mode: bool
    name: str | None = None
    runs_dir: str | None = None
    agent: bool = True
    quiet: bool = False
    gpus: str | None = None
    tap: bool = True
    web: bool = True
    host: str = "127.0.0.1"
    port: int | None = None
    declared: dict = msgspec.field(default_factory=dict)  # name -> declared.Declared
    component_env: dict = msgspec.field(
        default_factory=dict
    )  # plugin options and --heartbeat, for the components only
    profile_dirs: list = msgspec.field(default_factory=list)  # --profile-dir: traces to import at the end
    job: str | None = (
        None  # --job HOST:PORT, --node-rank, --nnodes, --job-keys, --no-job (run/job_discovery.py)
    )
    node_rank: int | None = None
    nnodes: int | None = None
    job_keys: str | None = None
    no_job: bool = False
    resume: str | None = None  # --resume RUN: continue that run as its next attempt
    new_run: bool = (
        False  # --new-run: never continue a run, nor refuse to start beside a live one of this command
    )
