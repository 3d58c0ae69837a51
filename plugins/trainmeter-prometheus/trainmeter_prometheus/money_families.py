"""Money on /metrics: the money families of one snapshot at the price the exporter was given (its own setting, else
the run's), each labelled with the price's currency and source. Pure, like ``families``; the figures are tm's own
(``trainmeter_core.api.money``), never recomputed here, and without a price there is no money family at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from trainmeter_core.api import Snapshot, money

# money figure (model/money.py) -> (family name, help)
MONEY_GAUGES = {
    "spent": ("trainmeter_money_spent", "Money spent so far: GPU-hours so far x the price per GPU-hour."),
    "per_1m_tokens": ("trainmeter_money_per_million_tokens", "Money spent x 1,000,000 / tokens seen."),
    "to_finish": ("trainmeter_money_to_finish", "Cost to finish: ETA x GPUs x the price per GPU-hour."),
    "projected": ("trainmeter_money_projected", "Money spent + the cost to finish."),
    "plan": ("trainmeter_money_plan", "The declared plan's hours (--plan-hours) x GPUs x the price."),
}


def money_families(
    snapshot: Snapshot, names: list[str], run: list[str], price: money.Price | None
) -> Iterator[Metric]:
    """Money at the price given, never without one (no price, no family): each family labelled with the run's label
    ``names`` (their values ``run``), the price's currency and its source."""
    if price is None:
        return
    doc = money.overlay(snapshot, price)
    labels = [*names, "currency", "price_source"]
    values = [*run, price.currency, price.source]
    rate = GaugeMetricFamily(
        "trainmeter_money_price_per_gpu_hour", "The price per GPU-hour money here is at.", labels=labels
    )
    rate.add_metric(values, price.per_gpu_hour)
    out: list[Metric] = [rate]
    for key, (name, help_text) in MONEY_GAUGES.items():
        family = GaugeMetricFamily(name, help_text, labels=labels)
        figure = doc["figures"][key]
        if "value" in figure:
            family.add_metric(values, figure["value"])
        out.append(family)
    lost = GaugeMetricFamily(
        "trainmeter_money_lost",
        "Money lost to each badput part of the time split: its seconds x GPUs x the price / 3600.",
        labels=[*labels, "part"],
    )
    for part, entry in doc["split"].items():
        if not entry["productive"] and "value" in entry:
            lost.add_metric([*values, part], entry["value"])
    out.append(lost)
    yield from (f for f in out if f.samples)
