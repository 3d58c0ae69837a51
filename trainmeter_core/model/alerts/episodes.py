"""Alert rules' common ground: what a rule answers, the thresholds a user sets in tm.toml, and the episodes.

Pure: no I/O, no clock. Time is the ``t`` of the snapshots the rules are shown, so a replay of the same snapshots gives
the same alerts. What a condition *is* belongs to the rules (``trainmeter_core.model.alerts``); delivering an alert
belongs to the sinks. An episode fires once, stays fired while its condition holds, and clears only after the
condition has stayed away for a while, longer each time it comes straight back (flapping is damped). At the run's end
(the final snapshot) nothing is left to wait for: every episode whose condition no longer holds clears then, with the
reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainmeter_core.model import records

__all__ = [
    "COMMON_DEFAULTS",
    "AlertConfigError",
    "Alerter",
    "Condition",
    "Episode",
    "Rule",
    "RuleState",
    "Verdict",
    "alert_config",
    "metric",
    "rule_config",
]

#: Thresholds every rule has, with these defaults unless the rule's own ``defaults`` say otherwise.
#: ``fire_after_s``: the condition must hold this long before the episode fires (0: at once).
#: ``clear_after_s``: the condition must stay away this long before the episode clears.
#: ``flap_window_s``: an episode that fires again within this long of its last clear is a flap, and each flap in a
#: row doubles the next clear's wait (up to 16×).
COMMON_DEFAULTS: dict[str, float] = {"fire_after_s": 0.0, "clear_after_s": 60.0, "flap_window_s": 600.0}
_MAX_FLAP_DOUBLINGS = 4
_TABLE = "alerts"


class AlertConfigError(ValueError):
    """A tm.toml ``[alerts]`` entry tm cannot use; the message is one line naming it and what is accepted."""


@dataclass(frozen=True)
class Condition:
    """One subject in (or out of) a rule's condition: a one-line message and the numbers behind it.

    ``subject`` names what it is about (``"n1/gpu0"``, ``"rank 1"``, ``"checkpoints"``), None for the run as a whole;
    ``severity`` overrides the rule's own for this condition, ``fire_after_s`` the rule's ``fire_after_s`` (a rule
    with two kinds of condition that must hold for different times: the straggler's).
    """

    message: str
    numbers: dict[str, float] = field(default_factory=dict)
    subject: str | None = None
    severity: records.Severity | None = None
    fire_after_s: float | None = None
    attachments: dict[str, str] = field(default_factory=dict)  # texts kept with the alert (a hang's stacks)


@dataclass
class Verdict:
    """A rule's answer for one snapshot.

    ``active``: the subjects whose condition holds now (every other subject is fine). ``normal``: optional words and
    numbers for subjects that are fine, used when their episode clears. ``held``: the rule cannot judge this snapshot
    (start-up, an eval span, not enough history): every episode of the rule stays as it is.
    """

    active: list[Condition] = field(default_factory=list)
    normal: list[Condition] = field(default_factory=list)
    held: bool = False


@dataclass
class RuleState:
    """What one rule carries between snapshots: its thresholds (defaults merged with tm.toml) and its own memory."""

    config: dict[str, float]
    memory: dict[str, Any] = field(default_factory=dict)


class Rule:
    """Base class of an alert rule: a pure function of its state and one snapshot.

    ``name`` is the rule's id (``[alerts.<name>]`` in tm.toml, ``alert.rule``); ``severity`` the default severity of
    its alerts; ``defaults`` its thresholds (plus ``COMMON_DEFAULTS``), each a number a user may override.
    ``evaluate`` must not raise for any snapshot, read a clock, or do I/O: a snapshot's ``t`` is the time.
    """

    name: ClassVar[str] = ""
    severity: ClassVar[records.Severity] = "warning"
    defaults: ClassVar[dict[str, float]] = {}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        raise NotImplementedError


def metric(snapshot: records.Snapshot, key: str) -> float | None:
    """The value of a snapshot metric, or None when it is absent (or not there at all)."""
    value = snapshot.metrics.get(key)
    return None if value is None else value.value


# ----------------------------------------------------------------------------------------------------------------------
# Thresholds from tm.toml


def rule_config(rule: Any, table: Mapping[str, Any] | None, where: str = "tm.toml") -> dict[str, float]:
    """The rule's thresholds: ``COMMON_DEFAULTS``, then its ``defaults``, then ``[alerts.<name>]`` of tm.toml.

    ``enabled = false`` turns the rule off (kept as 0.0 under ``enabled``). Raises AlertConfigError for a key the rule
    does not have or a value that is not a number ≥ 0.
    """
    config = dict(COMMON_DEFAULTS)
    config.update(getattr(rule, "defaults", {}) or {})
    config["enabled"] = 1.0
    label = f"{where} [{_TABLE}.{rule.name}]"
    if table is None:
        return config
    if not isinstance(table, Mapping):
        raise AlertConfigError(f"{label} must be a table of thresholds, e.g. [{_TABLE}.{rule.name}]")
    for key, value in table.items():
        if key == "enabled":
            if not isinstance(value, bool):
                raise AlertConfigError(f"{label} enabled: expected true or false, got {value!r}")
            config["enabled"] = 1.0 if value else 0.0
            continue
        if key not in config:
            accepted = ", ".join(sorted(config))
            raise AlertConfigError(f"{label}: unknown key {key!r}; accepted: {accepted}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise AlertConfigError(f"{label} {key}: expected a number ≥ 0, got {value!r}")
        config[key] = float(value)
    return config


def alert_config(
    document: Mapping[str, Any], rules: Iterable[Any], where: str = "tm.toml"
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Every rule's thresholds from a parsed tm.toml, and one line per entry that could not be used.

    A rule whose table is wrong keeps its defaults (the error says so); a table naming no rule is an error too.
    """
    rules = list(rules)
    section = document.get(_TABLE, {})
    errors: list[str] = []
    if not isinstance(section, Mapping):
        errors.append(f"{where}: '{_TABLE}' must be a table of rule tables, e.g. [{_TABLE}.hung]")
        section = {}
    names = {rule.name for rule in rules}
    for name in section:
        if name not in names:
            errors.append(f"{where} [{_TABLE}.{name}]: no such alert rule; rules: {', '.join(sorted(names))}")
    configs: dict[str, dict[str, float]] = {}
    for rule in rules:
        try:
            configs[rule.name] = rule_config(rule, section.get(rule.name), where)
        except AlertConfigError as exc:
            errors.append(f"{exc} (the rule keeps its defaults)")
            configs[rule.name] = rule_config(rule, None, where)
    return configs, errors


# ----------------------------------------------------------------------------------------------------------------------
# Episodes


@dataclass
class Episode:
    """One (rule, subject): whether it is fired, its episode number, and the times the damping needs."""

    fired: bool = False
    number: int = 0
    active_since_t: float | None = None  # the condition holds since (while not fired)
    quiet_since_t: float | None = None  # the condition is away since (while fired)
    fired_t: float | None = None
    cleared_t: float | None = None
    flaps: int = 0
    condition: Condition | None = None  # the latest active one
    back: Condition | None = None  # the rule's latest words for the subject since its condition went away


class Alerter:
    """Runs rules on snapshots and turns their verdicts into ``alert`` records: once per episode, damped."""

    def __init__(
        self, rules: Iterable[Any], configs: Mapping[str, Mapping[str, float]] | None = None
    ) -> None:
        configs = configs or {}
        self.rules: list[Any] = []
        self.states: dict[str, RuleState] = {}
        for rule in rules:
            config = dict(configs.get(rule.name) or rule_config(rule, None))
            if not config.get("enabled", 1.0):
                continue
            self.rules.append(rule)
            self.states[rule.name] = RuleState(config=config)
        self.episodes: dict[tuple[str, str | None], Episode] = {}
        self.errors: list[str] = []  # rules that raised, each turned off with one line here
        self.last_tick: int | None = None

    def restore(self, alerts: Iterable[records.Alert | records.Record | records.Unknown]) -> None:
        """Episodes as the run log left them (after a restart): open ones stay open, numbering goes on."""
        for alert in alerts:
            if not isinstance(alert, records.Alert):
                continue
            episode = self.episodes.setdefault((alert.rule, alert.subject), Episode())
            episode.number = max(episode.number, alert.episode)
            if alert.state == "fired":
                episode.fired, episode.fired_t = True, alert.since_t if alert.since_t is not None else alert.t
                episode.condition = Condition(
                    alert.message, dict(alert.numbers), alert.subject, alert.severity
                )
            else:
                episode.fired, episode.cleared_t = False, alert.t

    def observe(self, snapshot: records.Snapshot) -> list[records.Alert]:
        """The alerts one snapshot fires or clears. A snapshot of a tick already seen (a restarted engine) is skipped."""
        if not snapshot.final:
            if self.last_tick is not None and snapshot.tick <= self.last_tick:
                return []
            self.last_tick = snapshot.tick
        out: list[records.Alert] = []
        for rule in list(self.rules):
            state = self.states[rule.name]
            try:
                verdict = rule.evaluate(state, snapshot)
            except Exception as exc:  # a broken rule (a plugin's) is turned off; the others go on
                self.rules.remove(rule)
                self.errors.append(
                    f"alert rule {rule.name} failed and is off for this run: {type(exc).__name__}: {exc}"
                )
                continue
            if verdict.held:
                if snapshot.final:
                    out.extend(self._resolve_quiet(rule, snapshot))
                continue
            out.extend(self._step(rule, state.config, verdict, snapshot))
        return out

    def _step(
        self, rule: Any, config: Mapping[str, float], verdict: Verdict, snapshot: records.Snapshot
    ) -> list[records.Alert]:
        now = snapshot.t
        out: list[records.Alert] = []
        active = {c.subject: c for c in verdict.active}
        normal = {c.subject: c for c in verdict.normal}
        for subject, condition in active.items():
            episode = self.episodes.setdefault((rule.name, subject), Episode())
            episode.quiet_since_t = None
            episode.condition, episode.back = condition, None
            if episode.fired:
                continue
            if episode.active_since_t is None:
                episode.active_since_t = now
            fire_after_s = condition.fire_after_s
            if now - episode.active_since_t < (
                config["fire_after_s"] if fire_after_s is None else fire_after_s
            ):
                continue
            quick = episode.cleared_t is not None and now - episode.cleared_t < config["flap_window_s"]
            episode.flaps = episode.flaps + 1 if quick else 0
            episode.fired, episode.number, episode.fired_t = True, episode.number + 1, episode.active_since_t
            out.append(self._alert(rule, "fired", condition, episode, snapshot))
        for (name, subject), episode in self.episodes.items():
            if name != rule.name or subject in active:
                continue
            episode.active_since_t = None
            if not episode.fired:
                continue
            if episode.quiet_since_t is None:
                episode.quiet_since_t = now
            back = normal.get(subject)
            if back is not None:
                episode.back = back
            wait_s = config["clear_after_s"] * 2 ** min(episode.flaps, _MAX_FLAP_DOUBLINGS)
            # The run's end leaves nothing to wait for: an episode whose condition is gone clears now.
            if now - episode.quiet_since_t < wait_s and not snapshot.final:
                continue
            out.append(self._clear(rule, subject, episode, snapshot))
        return out

    def _resolve_quiet(self, rule: Any, snapshot: records.Snapshot) -> list[records.Alert]:
        """At the run's end, for a rule that cannot judge the final snapshot: its episodes whose condition was gone at
        its latest judgement (waiting out ``clear_after_s``) clear, with the rule's latest words for them; those whose
        condition still held stay fired."""
        return [
            self._clear(rule, subject, episode, snapshot)
            for (name, subject), episode in self.episodes.items()
            if name == rule.name and episode.fired and episode.quiet_since_t is not None
        ]

    def _clear(
        self,
        rule: Any,
        subject: str | None,
        episode: Episode,
        snapshot: records.Snapshot,
    ) -> records.Alert:
        """The episode's ``cleared`` record, in the rule's latest words for the subject while it was quiet."""
        now = snapshot.t
        back = episode.back
        episode.fired, episode.cleared_t = False, now
        lasted = now - (episode.fired_t if episode.fired_t is not None else now)
        words = back.message if back is not None else "the condition is gone"
        when = "at the run's end " if snapshot.final else ""
        condition = Condition(
            f"cleared {when}after {lasted:.0f} s: {words}",
            back.numbers if back is not None else {},
            subject,
            episode.condition.severity if episode.condition is not None else None,
        )
        return self._alert(rule, "cleared", condition, episode, snapshot)

    def open_episodes(self) -> list[tuple[str, str | None]]:
        """(rule, subject) of every episode fired and not yet cleared."""
        return sorted(
            ((key for key, e in self.episodes.items() if e.fired)), key=lambda k: (k[0], k[1] or "")
        )

    @staticmethod
    def _alert(
        rule: Any, state: str, condition: Condition, episode: Episode, snapshot: records.Snapshot
    ) -> records.Alert:
        return records.Alert(
            t=snapshot.t,
            wall=snapshot.wall,
            source="alerts",
            rule=rule.name,
            state=state,  # type: ignore[arg-type]
            severity=condition.severity or getattr(rule, "severity", "warning"),
            message=condition.message,
            numbers=dict(condition.numbers),
            subject=condition.subject,
            episode=episode.number,
            since_t=episode.fired_t,
            attachments=dict(condition.attachments) if state == "fired" else {},
        )
