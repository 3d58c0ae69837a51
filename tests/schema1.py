"""The old-to-new key table of schema 2 (docs/bus.md), applied to a snapshot written under schema 1.

Schema 1 named FLOP/s and FLOP counts alike ``flops``; schema 2 says ``_flop`` for a count and ``_flop_per_s`` for a
rate. Tests use this to compare what tm wrote before the change (summaries, replays kept as fixtures) with what it
computes now, field by field and floats exactly: the table is the only difference allowed.
"""

from __future__ import annotations

import copy
from typing import Any

from trainmeter_core.model.engine.snapshot import OLD_METRIC_KEYS
from trainmeter_core.model.facts import RENAMED_FACTS, RENAMED_VALUE_KEYS

#: Explain input keys that named a FLOP/s figure ``flops``.
RENAMED_INPUTS = {
    "peak_flops_per_device": "peak_flop_per_s_per_device",
    "peak_total_flops": "peak_total_flop_per_s",
    "flops_per_token": "flop_per_token",
}


def new_metric_key(key: str) -> str:
    head, dot, tail = key.partition(".")
    return OLD_METRIC_KEYS.get(head, head) + dot + tail


def new_input_key(key: str) -> str:
    if key.startswith("peak_flops "):  # one per device when the devices' peaks differ
        return "peak_flop_per_s " + key.removeprefix("peak_flops ")
    return RENAMED_INPUTS.get(key, key)


def upgrade_fact(fact: dict[str, Any]) -> dict[str, Any]:
    fact = dict(fact)
    fact["name"] = RENAMED_FACTS.get(fact["name"], fact["name"])
    keys = RENAMED_VALUE_KEYS.get(fact["name"])
    if keys and isinstance(fact.get("value"), dict):
        fact["value"] = {keys.get(k, k): v for k, v in fact["value"].items()}
    return fact


def upgrade_snapshot(old: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 snapshot (plain JSON data) as schema 2 writes it: new keys, the old metric keys kept as aliases."""
    snap = copy.deepcopy(old)
    if "metrics" in old:
        snap["metrics"] = dict(old["metrics"]) | {new_metric_key(k): v for k, v in old["metrics"].items()}
    explain = {}
    for key, item in old.get("explain", {}).items():
        item = dict(item)
        if "inputs" in item:
            item["inputs"] = {new_input_key(k): v for k, v in item["inputs"].items()}
        explain[new_metric_key(key)] = item
    if "explain" in old:
        snap["explain"] = explain
    if "facts" in old:
        facts = {}
        for key, fact in old["facts"].items():
            name, at, scope = key.partition("@")
            facts[RENAMED_FACTS.get(name, name) + at + scope] = upgrade_fact(fact)
        snap["facts"] = facts
    return snap
