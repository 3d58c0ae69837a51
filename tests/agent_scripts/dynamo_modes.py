"""A loop that lets dynamo in after a few eager steps, for tests/e2e/test_agent_dynamo.py.

Usage: dynamo_modes.py compile|function|export|export-strict. ``compile``: torch.compile(model) (backend "eager"),
then steps through the compiled model. ``function``: a compiled function (fullgraph) that calls the model, stepped
through. ``export``, ``export-strict``: torch.export.export of the model in training (its default, non-strict
tracing, or dynamo's), then eager steps again.
Prints one JSON object: the hooks at each attach point before and after, and the losses (float.hex).
"""

import json
import sys

import torch
import torch.optim.optimizer as optimizer_module

torch.set_num_threads(1)
torch.manual_seed(0)
nn = torch.nn
mode = sys.argv[1]
model = nn.Sequential(nn.Embedding(16, 4), nn.Linear(4, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(16, (8, 8), generator=torch.Generator().manual_seed(1))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
out: dict = {"losses": []}


def hooks() -> dict:
    iter_class = torch.utils.data.dataloader._BaseDataLoaderIter
    return {
        "next": type(iter_class.__dict__["__next__"]).__name__,
        "backward": type(torch.autograd.backward).__name__,
        "forward": type(model.__dict__.get("forward")).__name__,
        "step": [type(h).__name__ for h in optimizer_module._global_optimizer_pre_hooks.values()],
    }


def steps(trained, epochs: int) -> None:
    for _ in range(epochs):
        for (x,) in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(trained(x).flatten(0, 1), x.flatten())
            loss.backward()
            optimizer.step()
            out["losses"].append(loss.item().hex())


steps(model, 2)
out["before"] = hooks()
if mode == "compile":
    trained = torch.compile(model, backend="eager")
    steps(trained, 2)
elif mode == "function":

    def logits_of(x):
        return model(x) * 1.0

    steps(torch.compile(logits_of, backend="eager", fullgraph=True), 2)
else:
    exported = torch.export.export(model, (ids[:4],), strict=mode == "export-strict")
    out["exported"] = torch.equal(exported.module()(ids[:4]), model(ids[:4]))
    steps(model, 2)
out["after"] = hooks()
print(json.dumps(out))
