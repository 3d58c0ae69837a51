"""emit() given a complex tensor, then three real values: the complex one is refused alone, with one ``tm:`` line
naming its key, and emit stays on for every later call (issue 41, point 6)."""

import torch

from trainmeter_agent import emit

emit(x=torch.tensor(1j))
for y in (1.0, 2.0, 3.0):
    emit(y=y)
