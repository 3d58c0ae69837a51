"""The agent's outbox (trainmeter_agent/_outbox.py): the loop's rows leave as blocks, in order with the whole records
queued between them, each window counted in the steps it held; what a reader expands from the blocks is what the agent
would have sent record by record."""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import pytest

from trainmeter_agent import _outbox
from trainmeter_agent._outbox import Outbox
from trainmeter_agent._reasons import NO_TOKENS
from trainmeter_core.bus import step_page
from trainmeter_core.model import records
from trainmeter_core.model.records import block

# The rows' times are on the monotonic clock, as the loop's are: the flush thread compares them with it. Taken anew
# for each test (``_now``): a time taken at import is a minute old when a busy worker runs the test, and the thread
# would then find every window of 60 s due and send it in the middle of the test.
BASE_T = time.monotonic()


@pytest.fixture(autouse=True)
def _now():
    global BASE_T
    BASE_T = time.monotonic()


def _step(outbox: Outbox, step: int, loss: float | None = 2.5, **changed) -> None:
    t = BASE_T + step
    fields = dict(tokens=8, tokens_source="input_ids", dp=1)
    fields.update(changed)
    outbox.put_step(
        step,
        t,
        0.1,
        1,
        None,
        1,
        fields["tokens"],
        fields["tokens_source"],
        fields["dp"],
        loss,
        t - 0.05 if loss is not None else None,
    )


def _collecting(window_s: float = 60.0, max_records: int = 100) -> tuple[Outbox, list[list]]:
    sent: list[list] = []
    outbox = Outbox(sent.append, window_s=window_s, max_records=max_records)
    outbox.ready = True
    return outbox, sent


def _expanded(batch: list) -> list:
    out = []
    for record in batch:
        if type(record) is records.Block:
            block.validate(record)
            out.extend(block.expand(record))
        else:
            out.append(record)
    return out


def test_a_whole_record_between_rows_cuts_the_block_and_keeps_the_order():
    outbox, sent = _collecting()
    _step(outbox, 1)
    outbox.put_phase("data_wait", BASE_T + 1.0, BASE_T + 1.1, 1, "dataloader")
    outbox.put(records.Notice(topic="t", message="between"), BASE_T + 1.2)
    _step(outbox, 2, loss=None)  # no loss read at backward(): one record
    outbox.put_metric(BASE_T + 2.5, {"lr": 0.1}, None, "emit")
    outbox.flush()
    (batch,) = sent
    assert [records.kind_of(r) for r in batch] == ["block", "notice", "block"]
    assert [(b.order, b.rows) for b in (batch[0], batch[2])] == [("sp", 3), ("sm", 2)]
    kinds = [records.kind_of(r) for r in _expanded(batch)]
    assert kinds == ["metric", "step", "phase", "notice", "step", "metric"]
    metrics = [r for r in _expanded(batch) if records.kind_of(r) == "metric"]
    assert [(m.values, m.step, m.origin) for m in metrics] == [
        ({"train_loss": 2.5}, 1, "backward"),
        ({"lr": 0.1}, None, "emit"),
    ]


def test_what_a_block_says_once_for_its_steps_starts_another_block_when_it_changes():
    outbox, sent = _collecting()
    _step(outbox, 1)
    _step(outbox, 2)
    _step(outbox, 3, dp=2)
    _step(outbox, 4, tokens_source="attention_mask")
    outbox.flush()
    (batch,) = sent
    assert [(b.step, b.dp, b.tokens_source) for b in batch] == [
        ([1, 2], 1, "input_ids"),
        ([3], 2, "input_ids"),
        ([4], 1, "attention_mask"),
    ]
    steps = [r for r in _expanded(batch) if records.kind_of(r) == "step"]
    # tokens_global = tokens * dp: 8 * 1, 8 * 1, 8 * 2, 8 * 1
    assert [s.tokens_global for s in steps] == [8, 8, 16, 8]


def test_steps_without_tokens_are_a_block_of_their_own_that_says_why_once():
    outbox, sent = _collecting()
    _step(outbox, 1)
    _step(outbox, 2, tokens=None, tokens_source=None)  # the model saw no token ids in this step
    _step(outbox, 3, tokens=None, tokens_source=None)
    outbox.put_phase("data_wait", BASE_T + 3.0, BASE_T + 3.1, 3, "dataloader")
    _step(outbox, 4)
    outbox.flush()
    (batch,) = sent
    assert [(b.order, b.tokens, b.tokens_source, b.tokens_absent) for b in batch] == [
        ("s", [8], "input_ids", None),
        ("ssp", [], None, NO_TOKENS),
        ("s", [8], "input_ids", None),
    ]
    steps = [r for r in _expanded(batch) if records.kind_of(r) == "step"]
    assert [(s.tokens, s.tokens_global, s.absent) for s in steps] == [
        (8, 8, {}),
        (None, None, {"tokens": NO_TOKENS}),
        (None, None, {"tokens": NO_TOKENS}),
        (8, 8, {}),
    ]


def test_a_nan_loss_is_kept_and_an_absent_one_is_no_record():
    outbox, sent = _collecting()
    _step(outbox, 1, loss=math.nan)
    _step(outbox, 2, loss=None)
    _step(outbox, 3, loss=math.inf)
    outbox.flush()
    (only,) = sent[0]
    assert only.rows == 5  # three steps, two losses
    losses = [r.values["train_loss"] for r in _expanded([only]) if records.kind_of(r) == "metric"]
    assert math.isnan(losses[0]) and losses[1] == math.inf


def test_a_window_leaves_at_its_row_count_and_each_holds_its_own():
    outbox, sent = _collecting(max_records=3)
    for step in range(1, 8):
        _step(outbox, step)
    outbox.flush()
    assert [[s for b in batch for s in b.step] for batch in sent] == [[1, 2, 3], [4, 5, 6], [7]]
    assert outbox.windows == 3


def test_a_window_leaves_when_its_time_is_up_at_the_next_row():
    outbox, sent = _collecting(window_s=0.5)
    _step(outbox, 1)  # opens the window
    _step(outbox, 2)  # 1 s after it opened, over 0.5 s
    assert [[s for b in batch for s in b.step] for batch in sent] == [[1, 2]]


def test_a_processs_first_windows_are_short_and_the_rest_steady():
    # Steady windows of 60 s; the first two are at most START_WINDOW_S (50 ms) long: steps 1 s apart close each
    sent: list[list] = []
    outbox = Outbox(sent.append, window_s=60.0, max_records=100, start_windows=2)
    outbox.ready = True
    assert (outbox.window_s, outbox.max_records) == (_outbox.START_WINDOW_S, 100)  # the smaller of each bound
    for step in range(1, 8):
        _step(outbox, step)
    assert [[s for b in batch for s in b.step] for batch in sent] == [[1, 2], [3, 4]]
    assert (outbox.window_s, outbox.max_records) == (60.0, 100)
    outbox.flush()
    assert [s for b in sent[-1] for s in b.step] == [5, 6, 7]  # one steady window, 6 s of steps


def test_the_first_windows_hold_at_most_start_records_and_the_steady_ones_more():
    sent: list[list] = []
    outbox = Outbox(sent.append, window_s=60.0, max_records=3000, start_windows=1)
    outbox.ready = True
    for step in range(1, 4001):  # a microsecond apart: no window is due by its time
        outbox.put_step(step, BASE_T + step * 1e-6, 1e-6, 1, None, 1, 8, "input_ids", 1, None, None)
    outbox.flush()
    assert [sum(len(b.step) for b in batch) for batch in sent] == [_outbox.START_RECORDS, 3000]


def test_an_environment_that_chooses_the_window_has_it_from_the_first_row():
    assert _outbox.start_windows({"PATH": "/bin"}) == 20
    assert _outbox.start_windows({"TM_AGENT_FLUSH_S": "3600"}) == 0
    assert _outbox.start_windows({"TM_AGENT_FLUSH_RECORDS": "10"}) == 0


def test_a_larger_window_asked_for_later_gets_columns_to_hold_it():
    outbox, sent = _collecting(max_records=2)
    outbox.max_records = 5
    for step in range(1, 6):
        _step(outbox, step)
    outbox.flush()
    assert [[s for b in batch for s in b.step] for batch in sent] == [[1, 2], [3, 4, 5]]


def test_the_columns_keep_no_metric_values_once_they_left():
    outbox, sent = _collecting()
    values = {"lr": 0.5}
    outbox.put_metric(BASE_T, values, 1, "emit")
    outbox.flush()
    assert all(v is None for v in outbox._metric_cells)
    assert sent[0][0].metric_values == [values]


def test_the_step_page_counts_the_steps_queued_and_those_handed_to_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv(step_page.PAGES_ENV, str(tmp_path))
    outbox, sent = _collecting(max_records=4)
    _step(outbox, 1)  # before the page is mapped: carried over when it is
    outbox.open_page(outbox.max_records)
    for step in range(2, 7):
        _step(outbox, step)
    outbox.put(records.Step(step=7), BASE_T + 7.5, steps=1)
    page = step_page.read_page(tmp_path, os.getpid())
    # 7 steps counted; one window of 4 left (steps 1-4), steps 5, 6 and 7 wait in the open one.
    assert page == {"counted": 7, "handed": 4, "windows": 1, "window_records": 4}
    outbox.flush()
    assert step_page.read_page(tmp_path, os.getpid())["handed"] == 7


def test_a_page_that_is_not_the_agents_is_not_read(tmp_path):
    (tmp_path / "12.page").write_bytes(b"\0" * step_page.SIZE_B)
    assert step_page.read_page(tmp_path, 12) is None
    assert step_page.read_page(tmp_path, 13) is None


@pytest.mark.parametrize("queued", [0, 1])
def test_the_flush_thread_sends_a_window_the_loop_left_open(queued):
    outbox, sent = _collecting(window_s=0.01)
    for step in range(1, 1 + queued):
        outbox.put_step(step, time.monotonic(), 0.1, 1, None, 1, 8, "input_ids", 1, None, None)
    deadline = time.monotonic() + 30
    while len(sent) < queued and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sent) == queued


def test_threads_that_put_rows_while_windows_leave_lose_none_and_keep_their_order():
    # The columns' token (Outbox's docstring): two threads that put data waits, one that emits, the flush thread on a
    # 2 ms window and a send that gives up the GIL for a while, so that a window is cut and sent while the others wait
    # to write. Without the token a row written while another thread's cut ran was lost with the columns' reset.
    sent: list[list] = []

    def slow_send(batch: list) -> None:
        time.sleep(0.0005)
        sent.append(batch)

    outbox = Outbox(slow_send, window_s=0.002, max_records=50)
    outbox.ready = True
    rows = 2000

    def waits(probe: str) -> None:
        for step in range(1, rows + 1):
            now = time.monotonic()
            outbox.put_phase("data_wait", now - 0.001, now, step, probe)

    def emits() -> None:
        for step in range(1, rows + 1):
            outbox.put_metric(time.monotonic(), {"lr": float(step)}, step, "emit")

    threads = [threading.Thread(target=waits, args=(probe,)) for probe in ("first", "second")]
    threads.append(threading.Thread(target=emits))
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(
        1e-6
    )  # the GIL changes hands as often as it can: in the middle of a cut, among others
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sys.setswitchinterval(switch_s)
    outbox.flush()
    assert len(sent) > 10  # windows left while the threads wrote (a window holds at most 50 rows)
    out = [record for batch in sent for record in _expanded(batch)]
    for probe in ("first", "second"):
        assert [r.step for r in out if type(r) is records.Phase and r.probe == probe] == list(
            range(1, rows + 1)
        )
    assert [r.values["lr"] for r in out if type(r) is records.Metric] == [
        float(s) for s in range(1, rows + 1)
    ]
    assert outbox._token == [True]  # given back by every holder


class _InterruptedAsItReturns(list):
    """The token's list, where a signal's exception (a KeyboardInterrupt) is raised as ``pop()`` returns: CPython runs
    a signal's Python handler right after a call returns."""

    def pop(self, *args):
        taken = super().pop(*args)
        if not getattr(self, "interrupted", False):
            self.interrupted = True
            raise KeyboardInterrupt
        return taken


@pytest.mark.parametrize("call", ["put_phase", "put_metric", "put_step", "flush"])
def test_an_interrupt_as_the_token_is_taken_gives_it_back(call):
    outbox, sent = _collecting()
    outbox._token = _InterruptedAsItReturns([True])
    puts = {
        "put_phase": lambda: outbox.put_phase("data_wait", BASE_T, BASE_T + 0.1, 1, "dataloader"),
        "put_metric": lambda: outbox.put_metric(BASE_T, {"lr": 0.1}, 1, "emit"),
        "put_step": lambda: _step(outbox, 1),
        "flush": outbox.flush,
    }
    with pytest.raises(KeyboardInterrupt):
        puts[call]()
    assert outbox._token == [True]  # given back: the next put does not wait for ever
    assert not outbox._lock.locked()
    outbox.put_phase("data_wait", BASE_T, BASE_T + 0.2, 2, "dataloader")
    outbox.flush()
    assert [r.step for batch in sent for r in _expanded(batch) if type(r) is records.Phase][-1] == 2


def test_a_window_of_at_most_a_second_closes_at_the_first_row_after_a_multiple_of_its_length_on_the_clock():
    # Every process of a machine then sends the same stretch of time at once (docs/performance.md, "Windows of a
    # second"). The times are ahead of the clock: the flush thread never finds one of these windows due by itself.
    outbox, sent = _collecting(window_s=0.25)
    base = math.floor(time.monotonic()) + 100.0

    def row(step: int, t: float) -> None:
        outbox.put_phase("data_wait", t - 0.01, t, step, "dataloader")

    row(1, base + 0.10)
    row(2, base + 0.20)
    assert not sent
    row(3, base + 0.26)  # past base + 0.25, a multiple of 0.25 s, though the window opened 0.16 s before
    assert [len(b) for b in sent] == [1] and sent[0][0].phase_step == [1, 2, 3]
    row(4, base + 0.30)
    row(5, base + 0.49)
    assert len(sent) == 1
    row(6, base + 0.51)
    assert len(sent) == 2 and sent[1][0].phase_step == [4, 5, 6]
    # A window longer than ALIGNED_MAX_S (a test's hour, to close by count alone) keeps its length from its first row.
    assert _outbox.ALIGNED_MAX_S == 1.0
    long, long_sent = _collecting(window_s=60.0)
    minute = (math.floor(time.monotonic() / 60.0) + 2) * 60.0
    long.put_phase("data_wait", minute - 0.2, minute - 0.1, 1, "dataloader")
    long.put_phase("data_wait", minute + 0.1, minute + 0.2, 2, "dataloader")
    assert not long_sent
    long.put_phase("data_wait", minute + 59.9, minute + 59.95, 3, "dataloader")  # 60 s after its first row
    assert len(long_sent) == 1


def test_the_puts_store_each_field_where_its_column_is_read():
    # put_step and put_phase write a row's cells at offsets written out in their code (a name lookup each would cost
    # the loop): the widths they assume are the columns' own.
    assert (_outbox._STEP_WIDTH, _outbox._PHASE_WIDTH) == (9, 5)
    outbox, sent = _collecting()
    outbox.put_phase("data_wait", BASE_T + 0.5, BASE_T + 0.6, 7, "dataloader")
    outbox.put_step(8, BASE_T + 1.0, 0.25, 2, 31.5, 3, 24, "input_ids", 4, 1.5, BASE_T + 0.9)
    outbox.flush()
    (block,) = sent[0]
    assert (block.phase, block.phase_start_t, block.phase_end_t, block.phase_step, block.phase_probe) == (
        ["data_wait"],
        [BASE_T + 0.5],
        [BASE_T + 0.6],
        [7],
        ["dataloader"],
    )
    assert (block.step, block.step_t, block.step_time_s, block.optimizers, block.agent_us) == (
        [8],
        [BASE_T + 1.0],
        [0.25],
        [2],
        [31.5],
    )
    assert (block.micro_batches, block.tokens, block.loss, block.loss_t, block.dp) == (
        [3],
        [24],
        [1.5],
        [BASE_T + 0.9],
        4,
    )


def test_windows_of_one_row_each_leave_at_once_and_never_overrun_the_columns():
    # TM_AGENT_FLUSH_RECORDS=1: the columns have room for one row, so each row must leave before the next one comes
    # (a step's row then a phase's wrote past the order column's end, and stopped the steps probe).
    outbox, sent = _collecting(max_records=1)
    for step in range(1, 4):
        outbox.put_phase("data_wait", BASE_T + step - 0.2, BASE_T + step - 0.1, step, "dataloader")
        _step(outbox, step)
    outbox.flush()
    assert [[(b.order, b.rows) for b in batch] for batch in sent] == [[("p", 1)], [("s", 2)]] * 3
