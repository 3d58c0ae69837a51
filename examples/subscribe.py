"""Print a live run's step records: subscribing to trainmeter's bus from your own tool.

usage: python examples/subscribe.py [RUN]   (RUN: a run directory, name or prefix; default: the latest run)
"""

import sys

from trainmeter_core.bus import subscribe

run = sys.argv[1] if len(sys.argv) > 1 else None
for step in subscribe(run, kinds=["step"]):
    print(f"step {step.step} on {step.host} rank {step.rank}: {step.step_time_s} s", flush=True)
