"""Fork children of a training process (as DataLoader workers are) send nothing unless they call emit.

The parent runs three iterations, forks a quiet child and an emitting child, then emits itself. Prints one JSON line
with the pids.
"""

import json
import os
import sys

import torch

from trainmeter_agent import emit

torch.set_num_threads(1)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()


def fork(body):
    pid = os.fork()
    if pid == 0:
        body()
        sys.exit(0)  # a normal exit: atexit handlers run in the child too
    os.waitpid(pid, 0)
    return pid


quiet = fork(lambda: None)
talking = fork(lambda: emit(worker_value=7.0))
emit(parent_value=1.0)
print(json.dumps({"parent": os.getpid(), "quiet": quiet, "talking": talking}))
