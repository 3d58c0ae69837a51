"""A loop without torch.optim declares its own steps: emit(step=..., tokens=...), with its loss in the same call."""

from trainmeter_agent import emit

for step in range(1, 6):
    emit(step=step, tokens=4096, loss=1.0 / step)
    emit(step=step, lr=0.001)  # the same step again: labels the value, no second step record
