"""Every way through the agent's hottest hooks that a loop can take, for tests/test_agent_native.py, which runs it with
the C hooks and with their Python twins (TM_AGENT_NATIVE=0) and compares what each sent and what reached the loop.

Prints one JSON object: the losses (float.hex), the exceptions the loop caught, what the model's ``forward`` reads
as, and what copies and pickles of the model hold. Deterministic: the same run always prints the same object.
"""

import copy
import inspect
import io
import json
import pickle

import torch

torch.set_num_threads(1)
torch.manual_seed(0)
nn = torch.nn
out: dict = {"losses": [], "caught": []}


def hooks() -> dict:
    """What stands at each attach point now (class names: the C hooks or the Python ones)."""
    import torch.optim.optimizer as optimizer_module

    iter_class = torch.utils.data.dataloader._BaseDataLoaderIter
    return {
        "next": type(iter_class.__dict__["__next__"]).__name__,
        "backward": type(torch.autograd.backward).__name__,
        "forward": type(model.__dict__.get("forward")).__name__,
        "step": [type(h).__name__ for h in optimizer_module._global_optimizer_pre_hooks.values()],
    }


model = nn.Sequential(nn.Embedding(16, 4), nn.Linear(4, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(16, (24, 8), generator=torch.Generator().manual_seed(1))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
dict_loader = torch.utils.data.DataLoader([{"input_ids": row} for row in ids], batch_size=6)


def loss_of(x, **kwargs):
    logits = model(input=x) if kwargs.get("keyword") else model(x)
    return nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())


def step(x, **kwargs) -> None:
    optimizer.zero_grad()
    loss = loss_of(x, **kwargs)
    loss.backward()
    optimizer.step()
    out["losses"].append(loss.item().hex())


def caught(what: str, call) -> None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - what reaches the loop is the point
        out["caught"].append([what, type(exc).__name__, str(exc)[:80]])
    else:
        out["caught"].append([what, None, None])


# Three epochs: each ends in the DataLoader's own StopIteration, through the data-wait hook.
for _ in range(3):
    for (x,) in loader:
        step(x)
out["hooks_while_training"] = hooks()
# A batch that is a dict (the data wait's general way), a forward by keyword (the model probe's general way).
for batch in dict_loader:
    step(batch["input_ids"])
step(ids[:4], keyword=True)
# A second step without a backward (the same iteration), a step(closure), a step with no gradient at all.
step(ids[4:8])
optimizer.step()


def closure():
    optimizer.zero_grad()
    loss = loss_of(ids[8:12])
    loss.backward()
    return loss


out["losses"].append(optimizer.step(closure).item().hex())
optimizer.zero_grad(set_to_none=True)
optimizer.step()
step(ids[12:16])
# backward() on what is no 0-dim loss: a vector with its gradient, then two roots at once.
optimizer.zero_grad()
vector = model(ids[:2]).sum(dim=(1, 2))
vector.backward(torch.ones(2))
optimizer.step()
step(ids[:4])
first, second = loss_of(ids[:4]), loss_of(ids[4:8])
torch.autograd.backward([first, second])
optimizer.step()
step(ids[8:12])
# The loop's own errors reach it as they are, through every hook.
caught("forward", lambda: model(torch.full((2, 8), 99)))  # an index out of the embedding's range
spent = loss_of(ids[:4])
spent.backward()
caught("backward", lambda: spent.backward())  # the graph is freed: torch's RuntimeError
caught(
    "next", lambda: next(iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(0, 1)))))
)
caught("step", lambda: optimizer.step("not a closure"))
step(ids[:4])
# A forward that is not a training one (eval mode, no_grad), then back to training.
model.eval()
with torch.no_grad():
    model(ids[:4])
model.train()
step(ids[4:8])
# The model's forward reads as the bound method it stands for; copies and pickles carry none of it.
plain = nn.Sequential.forward.__get__(model)
out["forward_reads"] = {
    "self": model.forward.__self__ is model,
    "func": model.forward.__func__ is nn.Sequential.forward,
    "signature": str(inspect.signature(model.forward)) == str(inspect.signature(plain)),
}
copied = copy.deepcopy(model)
loaded = pickle.loads(pickle.dumps(model))
buffer = io.BytesIO()
torch.save(model, buffer)
buffer.seek(0)
saved = torch.load(buffer, weights_only=False)
replica = model._replicate_for_data_parallel()
out["copies"] = {
    name: "forward" in vars(other)
    for name, other in (("deepcopy", copied), ("pickle", loaded), ("torch.save", saved), ("replica", replica))
}
out["copies_work"] = torch.equal(copied(ids[:2]), model(ids[:2])) and torch.equal(
    loaded(ids[:2]), model(ids[:2])
)
for _ in range(3):
    step(ids[:4])
print(json.dumps(out))
