"""The built-in alert rules, registered through the ``trainmeter_alert_rules`` hook like any plugin's.

Each rule is a pure function of its state and one snapshot (``trainmeter_core.model.alerts.episodes.Rule``); none reads a clock or
does I/O. ``training`` holds the rules about the loop, ``machine`` those about the GPUs, disks and memory.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from trainmeter_core.model.alerts.machine import (
    DiskFull,
    GpuEcc,
    GpuIdle,
    GpuLost,
    GpuThrottle,
    GpuXid,
    HostMemory,
    NodeLost,
)
from trainmeter_core.model.alerts.training import Died, Hung, LossNan, LossSpike, Straggler, ThroughputDrop

#: Every built-in rule class, in the order their alerts are checked.
BUILTIN_RULES = (
    Hung,
    ThroughputDrop,
    LossNan,
    LossSpike,
    Straggler,
    Died,
    GpuThrottle,
    GpuXid,
    GpuEcc,
    GpuLost,
    GpuIdle,
    DiskFull,
    HostMemory,
    NodeLost,
)

__all__ = [
    "BUILTIN_RULES",
    "check_tm_toml",
    "Died",
    "DiskFull",
    "GpuEcc",
    "GpuIdle",
    "GpuLost",
    "GpuThrottle",
    "GpuXid",
    "HostMemory",
    "Hung",
    "LossNan",
    "LossSpike",
    "NodeLost",
    "Straggler",
    "ThroughputDrop",
    "unknown_rule_tables",
]


def check_tm_toml(
    document: Mapping[str, Any], where: str = "tm.toml", rules: Iterable[Any] | None = None
) -> list[str]:
    """One line per unusable ``[alerts]`` entry of a parsed tm.toml: for tm's command line to refuse at start (exit 2).

    ``rules`` are the rules loaded (the built-in ones and every plugin's; the built-in ones alone when None). A table
    of a rule with a bad key or value is an error, and so is a table that names no rule loaded: a typo such as
    ``[alerts.hungg]`` would otherwise leave the real rule at its defaults without a word.
    """
    from trainmeter_core.model.alerts.episodes import AlertConfigError, rule_config

    rules = [cls() for cls in BUILTIN_RULES] if rules is None else list(rules)
    section = document.get("alerts", {})
    if not isinstance(section, Mapping):
        return [f"{where}: 'alerts' must be a table of rule tables, e.g. [alerts.hung]"]
    names = sorted(rule.name for rule in rules)
    errors = []
    for name, table in section.items():
        if name not in names and not isinstance(table, Mapping):
            errors.append(
                f"{where} [alerts] {name}: thresholds go in a rule's table, e.g. [alerts.hung]; "
                f"the rules loaded: {', '.join(names)}"
            )
        elif name not in names:
            close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
            hint = f" (did you mean [alerts.{close[0]}]?)" if close else ""
            errors.append(
                f"{where} [alerts.{name}]: no such alert rule{hint}; the rules loaded: {', '.join(names)}"
            )
    for rule in rules:
        try:
            rule_config(rule, section.get(rule.name), where)
        except AlertConfigError as exc:
            errors.append(str(exc))
    return errors


def unknown_rule_tables(document: Mapping[str, Any]) -> list[str]:
    """The ``[alerts.<name>]`` tables no built-in rule owns: only a plugin can make them valid."""
    section = document.get("alerts", {})
    if not isinstance(section, Mapping):
        return []
    builtin = {cls.name for cls in BUILTIN_RULES}
    return [name for name in section if name not in builtin]
