"""A multiprocessing spawn child (and the resource tracker spawn starts) must keep the agent dormant.

Prints one JSON line: the parent's and the child's pid, and whether the child loaded any of the agent.
"""

import json
import multiprocessing
import os
import sys


def child(queue):
    agent_modules = sorted(name for name in sys.modules if name.startswith("trainmeter_agent"))
    queue.put({"pid": os.getpid(), "agent_modules": agent_modules})


if __name__ == "__main__":
    from trainmeter_agent import emit

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    seen = queue.get(timeout=60)
    process.join(60)
    emit(children=1)
    print(json.dumps({"parent": os.getpid(), "child": seen}))
