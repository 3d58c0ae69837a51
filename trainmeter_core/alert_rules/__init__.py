"""The built-in alert rules, registered through the ``trainmeter_alert_rules`` hook like any plugin's.

Each rule is a pure function of its state and one snapshot (``trainmeter_core.alerts.Rule``); none reads a clock or
does I/O. ``training`` holds the rules about the loop, ``machine`` those about the GPUs, disks and memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmeter_core.alert_rules.machine import DiskFull, GpuEcc, GpuLost, GpuThrottle, GpuXid, HostMemory
from trainmeter_core.alert_rules.training import Died, Hung, LossNan, LossSpike, Straggler, ThroughputDrop

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
    DiskFull,
    HostMemory,
)

__all__ = [
    "BUILTIN_RULES",
    "check_tm_toml",
    "Died",
    "DiskFull",
    "GpuEcc",
    "GpuLost",
    "GpuThrottle",
    "GpuXid",
    "HostMemory",
    "Hung",
    "LossNan",
    "LossSpike",
    "Straggler",
    "ThroughputDrop",
]


def check_tm_toml(document: Mapping[str, Any], where: str = "tm.toml") -> list[str]:
    """One line per unusable ``[alerts.<rule>]`` table of a built-in rule: for tm's command line to refuse at start.

    Tables naming other rules are left alone (a plugin may provide them; the alerts component says so if none does).
    """
    from trainmeter_core.alerts import AlertConfigError, rule_config

    section = document.get("alerts", {})
    if not isinstance(section, Mapping):
        return [f"{where}: 'alerts' must be a table of rule tables, e.g. [alerts.hung]"]
    errors = []
    for cls in BUILTIN_RULES:
        try:
            rule_config(cls(), section.get(cls.name), where)
        except AlertConfigError as exc:
            errors.append(str(exc))
    return errors
