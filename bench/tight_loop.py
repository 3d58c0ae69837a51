"""The tight CPU loop of the per-step benches, its data and model as source text: the benches run it in their own
subprocesses (plain, under tm, under 0.0.7, under callgrind), each around it with its own timing, so the loop they
measure is the one defined here: Embedding(16, 4) + Linear(4, 16), DataLoader batch 1, AdamW."""

import time

#: The data, the model and the optimizer (``torch`` imported and its threads set by the script around it).
DATA_AND_MODEL = """
ids = torch.randint(16, (4096, 8))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=1)
model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
"""


def made_here(torch) -> tuple:
    """The loop made in this process, as the scripts around ``DATA_AND_MODEL`` make it (one thread, seed 0): its
    loader, model, optimizer and an endless iterator over the loader's batches."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    scope: dict = {"torch": torch}
    exec(DATA_AND_MODEL, scope)
    loader = scope["loader"]

    def forever():
        while True:
            yield from loader

    return loader, scope["model"], scope["optimizer"], forever()


def timed_run(torch, model, optimizer, source):
    """The loop's iterations as the in-process benches run them: ``run(n)`` runs n, ``run(n, times)`` also appends
    each one's wall time in ns to ``times`` (the clock read around the iteration, nothing else)."""
    clock = time.perf_counter_ns

    def run(n: int, times: list[int] | None = None) -> None:
        for _ in range(n):
            started = clock() if times is not None else 0
            (x,) = next(source)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            optimizer.step()
            if times is not None:
                times.append(clock() - started)

    return run
