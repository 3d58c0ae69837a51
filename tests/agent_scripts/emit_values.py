"""emit() with the kinds of values a loop passes: numbers, bools, 0-dim CPU tensors, and tensors it must refuse.

A tensor on another device ("meta" stands in for an accelerator on a CPU machine) and a tensor of several values
are skipped with one ``tm:`` line each; everything else becomes one metric record per call.
"""

import torch

from trainmeter_agent import emit

emit(loss=torch.tensor(2.5), n=3, flag=True)
emit(accelerator=torch.tensor(1.0, device="meta"), vector=torch.ones(2), kept=0.25)
emit(accelerator=torch.tensor(1.0, device="meta"))  # said once already: no second line
emit(label="text")
