"""Money, a view (model/money.py): a price per GPU-hour from a flag, the environment or tm.toml, in that order, each
figure a pure function of one snapshot and the price, and absent with its reason where there is no price."""

from __future__ import annotations

import pytest
from test_engine import Run, feed

from trainmeter_core.model import money, records
from trainmeter_core.model.declared import parse_declared

PRICE = money.Price(7.3193, "USD", money.PRICE_FLAG)


def two_gpu_run(budget_tokens: int | None = 100_000, plan_hours: float | None = None) -> records.Snapshot:
    """Two H100s, 21 steps of 1,000 tokens every 0.5 s from 110 s (the run started at 100 s), a tick at 136 s."""
    run = Run()
    for rank in (0, 1):
        run.gpu(rank, f"GPU-{rank}")
        run.device(rank, index=rank, uuid=f"GPU-{rank}")
    if budget_tokens is not None:
        run.fact("budget_tokens", budget_tokens)
    if plan_hours is not None:
        run.fact("plan_hours", plan_hours)
    run.steps(1, 21, tokens_global=1000)
    run.add(records.Phase(t=118.0, start_t=116.0, end_t=118.0, phase="checkpoint"))
    run.tick(136.0, 1)
    _, (snap,) = feed(run.records)
    return snap


# ----------------------------------------------------------------------------------------------------------------------
# Where the price comes from


def test_the_flag_beats_the_environment_which_beats_tm_toml():
    environ = {"TM_PRICE_PER_GPU_HOUR": "3.5", "TM_PRICE_CURRENCY": "EUR"}
    document = {"price_per_gpu_hour": 1.25, "price_currency": "GBP"}
    flag = money.resolve("7.3193", None, environ, document, "/w/tm.toml")
    assert (flag.per_gpu_hour, flag.currency, flag.source) == (7.3193, "USD", "--price-per-gpu-hour")
    env = money.resolve(None, None, environ, document, "/w/tm.toml")
    assert (env.per_gpu_hour, env.currency, env.source) == (3.5, "EUR", "TM_PRICE_PER_GPU_HOUR")
    toml = money.resolve(None, None, {}, document, "/w/tm.toml")
    assert (toml.per_gpu_hour, toml.currency) == (1.25, "GBP")
    assert toml.source == "tm.toml price_per_gpu_hour (/w/tm.toml)"


def test_tm_toml_may_hold_the_price_under_run_too():
    price = money.resolve(None, None, {}, {"run": {"price_per_gpu_hour": "2.49"}}, "tm.toml")
    assert price.per_gpu_hour == 2.49


def test_no_source_gives_no_price_and_money_says_why():
    assert money.resolve(None, None, {}, {}, "tm.toml") is None
    assert money.overlay(records.Snapshot(tick=1), None) == {
        "absent": "no price given: --price-per-gpu-hour, TM_PRICE_PER_GPU_HOUR or tm.toml price_per_gpu_hour"
    }
    assert money.words({"absent": money.NO_PRICE}).startswith(
        "money n/a (no price given: --price-per-gpu-hour"
    )


def test_each_figure_names_the_price_and_its_source_and_a_defaulted_currency_says_so():
    assert PRICE.words() == "price 7.3193 USD/GPU-h from --price-per-gpu-hour"
    defaulted = money.resolve("2.49", None, {}, None)
    assert (
        defaulted.words()
        == "price 2.49 USD/GPU-h from --price-per-gpu-hour (no currency given: USD by default)"
    )
    assert money.resolve("2.49", "eur", {}, None).words() == "price 2.49 EUR/GPU-h from --price-per-gpu-hour"


@pytest.mark.parametrize(
    ("flag", "currency", "environ", "document", "words"),
    [
        ("free", None, {}, None, "--price-per-gpu-hour 'free': give a positive number per GPU-hour"),
        ("-1", None, {}, None, "--price-per-gpu-hour '-1': give a positive number"),
        ("nan", None, {}, None, "give a positive number"),
        ("2.49", "dollars", {}, None, "--price-currency 'dollars': give a three-letter currency code"),
        (None, "EUR", {}, None, "--price-currency needs --price-per-gpu-hour"),
        (
            None,
            None,
            {"TM_PRICE_CURRENCY": "EUR"},
            None,
            "TM_PRICE_CURRENCY is set but TM_PRICE_PER_GPU_HOUR",
        ),
        (None, None, {"TM_PRICE_PER_GPU_HOUR": "0"}, None, "TM_PRICE_PER_GPU_HOUR '0'"),
        (None, None, {}, {"price_currency": "EUR"}, "price_currency without price_per_gpu_hour"),
        (None, None, {}, {"price_per_gpu_hour": True}, "tm.toml price_per_gpu_hour (tm.toml) True"),
    ],
)
def test_a_price_that_cannot_be_used_is_one_line_naming_where_it_was_given(
    flag, currency, environ, document, words
):
    with pytest.raises(money.PriceError) as caught:
        money.resolve(flag, currency, environ, document, "tm.toml")
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_price_handed_to_the_components_keeps_its_source():
    toml = money.resolve(
        None, None, {}, {"price_per_gpu_hour": 7.3193, "price_currency": "EUR"}, "/w/tm.toml"
    )
    assert money.from_environ(money.handed_on(toml)) == toml
    flag = money.resolve("7.3193", None, {}, None)
    assert money.from_environ(money.handed_on(flag)) == flag  # the default currency stays a default
    assert money.handed_on(None) == {}


def test_price_keys_in_tm_toml_are_no_declared_input():
    declared = parse_declared(
        {}, {"price_per_gpu_hour": 7.3193, "price_currency": "EUR", "layers": 2}, "tm.toml"
    )
    assert list(declared) == ["layers"]


def test_price_variables_are_the_tm_ones_naming_a_price():
    assert money.is_price_variable("TM_PRICE_PER_GPU_HOUR")
    assert money.is_price_variable("TM_PRICE_FROM")
    assert money.is_price_variable("TM_PROMETHEUS_PRICE_PER_GPU_HOUR")
    assert not money.is_price_variable("TM_RUNS_DIR")
    assert not money.is_price_variable("PRICE")


# ----------------------------------------------------------------------------------------------------------------------
# The figures


def test_money_spent_is_gpu_hours_times_the_price():
    snap = two_gpu_run()
    doc = money.overlay(snap, PRICE)
    # 36 s × 2 GPUs / 3600 = 0.02 GPU-h; × 7.3193 = 0.146386
    assert snap.metrics["gpu_hours"].value == pytest.approx(0.02)
    assert doc["figures"]["spent"]["value"] == pytest.approx(0.146386)
    assert doc["figures"]["spent"]["unit"] == "USD"
    assert doc["price"]["words"] == "price 7.3193 USD/GPU-h from --price-per-gpu-hour"
    assert doc["scope"] == "the run's 2 GPUs"
    # 21 steps × 1,000 tokens: 0.146386 × 1e6 / 21,000
    assert doc["figures"]["per_1m_tokens"]["value"] == pytest.approx(0.146386 * 1e6 / 21_000)


def test_the_cost_to_finish_is_eta_times_the_price_times_the_gpus_of_the_same_snapshot():
    snap = two_gpu_run()
    doc = money.overlay(snap, PRICE)
    eta_s = snap.metrics["eta_s"].value
    assert eta_s > 0
    assert doc["figures"]["to_finish"]["value"] == pytest.approx(eta_s / 3600 * 7.3193 * 2, rel=1e-12)
    spent = doc["figures"]["spent"]["value"]
    assert doc["figures"]["projected"]["value"] == pytest.approx(spent + eta_s / 3600 * 7.3193 * 2, rel=1e-12)


def test_without_a_budget_the_cost_to_finish_names_the_budget():
    doc = money.overlay(two_gpu_run(budget_tokens=None), PRICE)
    assert doc["figures"]["to_finish"]["absent"] == "budget not declared: pass --budget-tokens"
    assert "value" not in doc["figures"]["projected"]


def test_the_declared_plan_is_priced():
    doc = money.overlay(two_gpu_run(plan_hours=10.0), PRICE)
    # 10 h × 2 GPUs × 7.3193
    assert doc["figures"]["plan"]["value"] == pytest.approx(146.386)
    assert (
        money.overlay(two_gpu_run(), PRICE)["figures"]["plan"]["absent"]
        == "plan not declared: pass --plan-hours"
    )


def test_every_part_of_the_time_split_is_priced_and_the_parts_add_up_to_the_money_spent():
    snap = two_gpu_run()
    doc = money.overlay(snap, PRICE)
    split = doc["split"]
    assert set(split) == set(snap.phases_s)  # whatever parts the split has, no fixed list
    # the 2 s checkpoint on 2 GPUs: 4 GPU-s × 7.3193 / 3600
    assert split["checkpoint"]["value"] == pytest.approx(4 * 7.3193 / 3600)
    assert not split["checkpoint"]["productive"] and split["compute"]["productive"]
    total = sum(entry["value"] for entry in split.values())
    assert total == pytest.approx(doc["figures"]["spent"]["value"], rel=1e-9)
    lost = sum(entry["value"] for part, entry in split.items() if part != "compute")
    assert doc["figures"]["lost"]["value"] == pytest.approx(lost)


def test_a_part_the_split_gains_later_is_priced_like_the_others():
    snap = two_gpu_run()
    snap.phases_s["hang"] = 9.0
    doc = money.overlay(snap, PRICE)
    assert doc["split"]["hang"]["value"] == pytest.approx(18 * 7.3193 / 3600)
    assert not doc["split"]["hang"]["productive"]


def test_a_cpu_run_has_no_money_and_says_why():
    run = Run()
    run.device(0, "cpu")
    run.steps(1, 3, tokens=100)
    run.tick(120.0, 1)
    _, (snap,) = feed(run.records)
    doc = money.overlay(snap, PRICE)
    assert doc["figures"]["spent"]["absent"] == "the run computes on no GPU (its devices: cpu)"
    assert all("value" not in figure for figure in doc["figures"].values())
    assert money.words(doc).startswith("money n/a (the run computes on no GPU")


def test_a_finished_run_has_nothing_left_to_pay():
    snap = two_gpu_run()
    snap.final = True
    assert money.overlay(snap, PRICE)["figures"]["to_finish"]["absent"] == "the run has ended"


def test_a_summary_gives_the_money_of_its_final_snapshot():
    snap = two_gpu_run()
    summary = {"state": "finished", "snapshot": records.to_builtins(snap)}
    assert money.overlay_of_summary(summary, PRICE)["figures"]["spent"]["value"] == pytest.approx(0.146386)
    assert money.overlay_of_summary({}, PRICE)["absent"] == "the run's summary holds no snapshot"
    assert money.overlay_of_summary(summary, None) == {"absent": money.NO_PRICE}


def test_compare_rows_set_each_runs_money_against_the_first():
    first, second = two_gpu_run(), two_gpu_run()
    second.phases_s["hang"] = 3.0
    rows = {row["key"]: row for row in money.comparison_rows([first, second], PRICE)}
    assert rows["money.spent"]["values"] == [pytest.approx(0.146386)] * 2
    assert rows["money.spent"]["ratio"][1] == pytest.approx(1.0)
    # The time split names every bucket (0 s where a run spent none): a bucket at 0 s costs that run nothing.
    assert rows["money.lost.hang"]["values"] == [0.0, pytest.approx(6 * 7.3193 / 3600)]
    assert "money.lost.eval" not in rows  # neither run spent a second in eval
    assert "money.plan" not in rows  # no run declared a plan
    # both runs still run towards their token budget: the cost to finish, each its own ETA priced
    assert rows["money.to_finish"]["values"] == [
        pytest.approx(s.metrics["eta_s"].value / 3600 * 2 * 7.3193) for s in (first, second)
    ]
    assert money.comparison_rows([first, second], None) == []


def test_amounts_read_as_money():
    assert money.money_text(1234.5, "USD") == "1,234.50 USD"
    assert money.money_text(0.0123456, "EUR") == "0.0123 EUR"


def test_a_jobs_head_node_prices_the_gpus_of_every_node():
    from test_engine import H100_URL
    from test_engine_nodes import AHEAD_S, Job, snapshots

    job = Job()
    job.records = [r for r in job.records if not (isinstance(r, records.Fact) and r.name == "device")]
    for rank, host in enumerate(("node0", "node1", "node2")):
        own_t = 101.0 + AHEAD_S.get(host, 0.0)  # each node's records on its own clock
        gpu = {"index": 0, "uuid": f"GPU-{host}", "name": "NVIDIA H100 80GB HBM3", "spec_id": "h100-sxm",
               "dense_bf16_flop_per_s": 989.4e12, "peak_source": H100_URL}  # fmt: skip
        job.add(records.Fact(t=own_t, host=host, name="gpu", value=gpu, provenance="detected",
                             origin="sampler:nvml", device=f"{host}/gpu0"))  # fmt: skip
        job.add(records.Fact(t=own_t, host=host, rank=rank, name="device", provenance="detected",
                             origin="agent:model", value={"type": "cuda", "index": 0, "uuid": f"GPU-{host}"}))  # fmt: skip
    for step in range(1, 4):
        for rank, host in enumerate(("node0", "node1", "node2")):
            job.step(host, rank, step, 110.0 + step)
    job.tick(1, 136.0)
    for seq, record in enumerate(job.records, 1):
        record.seq = seq
    (snap,) = snapshots(job.records)
    doc = money.overlay(snap, PRICE)
    # 36 s × 3 GPUs (one on each node) / 3600 = 0.03 GPU-h, × 7.3193
    assert doc["figures"]["spent"]["value"] == pytest.approx(0.03 * 7.3193)
    assert doc["scope"] == "the job's 3 GPUs over 3 nodes"
