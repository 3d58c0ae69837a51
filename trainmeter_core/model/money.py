"""Money, a view-time overlay: a price per GPU-hour, given by whoever looks, times the GPU-time a snapshot holds.

Pure: the price's sources (a flag, the environment, tm.toml) are values handed in, and every figure is a function of
one snapshot and one price. Nothing here is a record and nothing here is written: the run log holds physics, never a
price (SPEC invariant 9), so a price lives only in the memory of the view that was given it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from trainmeter_core.model import records

PRICE_FLAG = "--price-per-gpu-hour"
CURRENCY_FLAG = "--price-currency"
PRICE_ENV = "TM_PRICE_PER_GPU_HOUR"
CURRENCY_ENV = "TM_PRICE_CURRENCY"
#: Where a price the launcher resolved came from, handed to its components beside the price (never to the training).
FROM_ENV = "TM_PRICE_FROM"
PRICE_KEY = "price_per_gpu_hour"
CURRENCY_KEY = "price_currency"
#: tm.toml keys this module reads (at the top level or under [run]); the declared inputs leave them alone.
TOML_KEYS = (PRICE_KEY, CURRENCY_KEY)
DEFAULT_CURRENCY = "USD"
NO_PRICE = f"no price given: {PRICE_FLAG}, {PRICE_ENV} or tm.toml {PRICE_KEY}"
#: The parts of the time split that trained the model; every other part is badput, priced as money lost.
PRODUCTIVE_PARTS = frozenset({"compute"})
_CURRENCY_RE = re.compile(r"[A-Z]{3}")
_PRICE_ACCEPTED = "give a positive number per GPU-hour such as 2.49"
_CURRENCY_ACCEPTED = "give a three-letter currency code such as USD or EUR"


class PriceError(ValueError):
    """A price or currency that cannot be used: one line naming where it was given and what is accepted.
    ``unquoted`` says the same without the value given, for a line that may be recorded (a notice on the bus)."""

    def __init__(self, message: str, unquoted: str | None = None) -> None:
        super().__init__(message)
        self.unquoted = unquoted or message


class Price(msgspec.Struct, frozen=True):
    """A price per GPU-hour, its currency and where it was given (``--price-per-gpu-hour``, an environment variable,
    ``tm.toml price_per_gpu_hour (PATH)``); ``currency_given`` is False where the currency is the default."""

    per_gpu_hour: float
    currency: str
    source: str
    currency_given: bool = True

    def words(self) -> str:
        """``price 2.49 USD/GPU-h from --price-per-gpu-hour``; a defaulted currency says so."""
        default = "" if self.currency_given else f" (no currency given: {DEFAULT_CURRENCY} by default)"
        return f"price {self.per_gpu_hour:g} {self.currency}/GPU-h from {self.source}{default}"

    def doc(self) -> dict[str, Any]:
        return {
            "per_gpu_hour": self.per_gpu_hour,
            "currency": self.currency,
            "currency_given": self.currency_given,
            "source": self.source,
            "words": self.words(),
        }


# ----------------------------------------------------------------------------------------------------------------------
# Where a price comes from: flag > environment > tm.toml (the exporter's own setting first, for the exporter)


def parse_price(raw: object, label: str) -> float:
    text = str(raw).strip() if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else None
    try:
        value = float(text) if text else math.nan
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        shown = raw if not isinstance(raw, str) or len(raw) <= 40 else raw[:37] + "..."
        raise PriceError(f"{label} {shown!r}: {_PRICE_ACCEPTED}", f"{label}: {_PRICE_ACCEPTED}")
    return value


def parse_currency(raw: object, label: str) -> str:
    code = raw.strip().upper() if isinstance(raw, str) else ""
    if not _CURRENCY_RE.fullmatch(code):
        raise PriceError(f"{label} {raw!r}: {_CURRENCY_ACCEPTED}", f"{label}: {_CURRENCY_ACCEPTED}")
    return code


def price_of(raw_price: object, raw_currency: object, source: str, currency_label: str) -> Price:
    """One source's price and its currency (the default where that source names none)."""
    value = parse_price(raw_price, source)
    if raw_currency is None or raw_currency == "":
        return Price(value, DEFAULT_CURRENCY, source, currency_given=False)
    return Price(value, parse_currency(raw_currency, currency_label), source)


def from_environ(
    environ: Mapping[str, str], price_env: str = PRICE_ENV, currency_env: str = CURRENCY_ENV
) -> Price | None:
    """The price an environment gives (``TM_PRICE_PER_GPU_HOUR``, its currency in ``TM_PRICE_CURRENCY``), named by its
    variable, or by ``TM_PRICE_FROM`` where the launcher handed on a price it resolved; None without one."""
    raw = environ.get(price_env, "").strip()
    currency = environ.get(currency_env, "").strip()
    if not raw:
        if currency:
            raise PriceError(
                f"{currency_env} is set but {price_env} is not: a currency without a price says nothing"
            )
        return None
    price = price_of(raw, currency or None, price_env, currency_env)
    handed = environ.get(FROM_ENV, "").strip() if price_env == PRICE_ENV else ""
    if handed:
        price = Price(price.per_gpu_hour, price.currency, handed, price.currency_given)
    return price


def from_toml(document: Mapping[str, object], path: str) -> Price | None:
    """The price of a tm.toml (``price_per_gpu_hour``, ``price_currency``, at the top level or under ``[run]``)."""
    found: dict[str, object] = {k: document[k] for k in TOML_KEYS if k in document}
    run_table = document.get("run")
    if isinstance(run_table, Mapping):
        found.update({k: run_table[k] for k in TOML_KEYS if k in run_table})
    if PRICE_KEY not in found:
        if CURRENCY_KEY in found:
            raise PriceError(
                f"{path}: {CURRENCY_KEY} without {PRICE_KEY}: a currency without a price says nothing"
            )
        return None
    return price_of(
        found[PRICE_KEY], found.get(CURRENCY_KEY), f"tm.toml {PRICE_KEY} ({path})", f"{path}:{CURRENCY_KEY}"
    )


def resolve(
    flag_price: str | None,
    flag_currency: str | None,
    environ: Mapping[str, str],
    toml_document: Mapping[str, object] | None = None,
    toml_path: str = "tm.toml",
) -> Price | None:
    """The price a command was given: ``--price-per-gpu-hour`` beats ``TM_PRICE_PER_GPU_HOUR``, which beats tm.toml's
    ``price_per_gpu_hour``. Each source's currency goes with its price. None where none gives one."""
    if flag_price is not None:
        return price_of(flag_price, flag_currency, PRICE_FLAG, CURRENCY_FLAG)
    if flag_currency is not None:
        raise PriceError(f"{CURRENCY_FLAG} needs {PRICE_FLAG}: a currency without a price says nothing")
    price = from_environ(environ)
    if price is not None:
        return price
    return from_toml(toml_document, toml_path) if toml_document else None


def handed_on(price: Price | None) -> dict[str, str]:
    """The variables that hand a resolved price to tm's components (the dashboard, the exporter), source and all."""
    if price is None:
        return {}
    env = {PRICE_ENV: repr(price.per_gpu_hour), FROM_ENV: price.source}
    if price.currency_given:
        env[CURRENCY_ENV] = price.currency
    return env


def is_price_variable(name: str) -> bool:
    """Whether an environment variable carries a price (tm's own and a plugin's, such as the exporter's): such a
    variable is never written into a run's description."""
    return name.startswith("TM_") and "PRICE" in name


# ----------------------------------------------------------------------------------------------------------------------
# The figures: a pure function of one snapshot and one price


def _figure(
    value: float | None,
    currency: str,
    formula: str,
    absent: str | None = None,
    **inputs: float | int | str | None,
) -> dict[str, Any]:
    if absent is None and (value is None or not math.isfinite(value)):
        absent = f"not a finite number: an input is out of range ({formula})"
    doc: dict[str, Any] = {"unit": currency, "formula": formula}
    if absent is not None:
        doc["absent"] = absent
    else:
        doc["value"] = value
    doc["inputs"] = {k: v for k, v in inputs.items() if v is not None}
    return doc


def _value(snapshot: records.Snapshot, key: str) -> tuple[float | None, str | None]:
    metric = snapshot.metrics.get(key)
    if metric is None:
        return None, f"{key} not in the snapshot"
    return metric.value, (None if metric.value is not None else metric.absent or f"{key} unknown")


def gpus(snapshot: records.Snapshot) -> tuple[int | None, str | None]:
    """The GPUs the run pays for (every node's, on a job's head node) as the engine counted them for GPU-hours."""
    gpu_hours, why = _value(snapshot, "gpu_hours")
    if gpu_hours is None:
        return None, why
    explain = snapshot.explain.get("gpu_hours")
    found = explain.inputs.get("n_devices") if explain is not None else None
    if found is not None and isinstance(found.value, int) and found.value > 0:
        return found.value, None
    if snapshot.elapsed_s:
        return round(gpu_hours * 3600.0 / snapshot.elapsed_s), None
    return None, "no elapsed time yet"


def part_title(part: str) -> str:
    return part.replace("_", " ")


def overlay(snapshot: records.Snapshot, price: Price | None) -> dict[str, Any]:
    """What the price makes of a snapshot: money spent so far, per 1M tokens, to finish, projected and planned, and
    lost per part of the time split. Without a price, only the reason (``NO_PRICE``): money is never guessed."""
    if price is None:
        return {"absent": NO_PRICE}
    cur = price.currency
    rate = price.per_gpu_hour
    n, n_absent = gpus(snapshot)
    gpu_hours, hours_absent = _value(snapshot, "gpu_hours")
    figures: dict[str, dict[str, Any]] = {}
    spent = gpu_hours * rate if gpu_hours is not None else None
    figures["spent"] = _figure(
        spent, cur, "GPU-hours so far × price", hours_absent, gpu_hours=gpu_hours, price_per_gpu_hour=rate
    )
    tokens = snapshot.tokens
    if spent is None:
        per_tokens_absent = hours_absent
    elif not tokens:
        per_tokens_absent = (
            "no token seen" if tokens == 0 else "tokens per step unknown: pass --tokens-per-step"
        )
    else:
        per_tokens_absent = None
    figures["per_1m_tokens"] = _figure(
        spent * 1e6 / tokens if per_tokens_absent is None and spent is not None and tokens else None,
        cur,
        "money spent × 1,000,000 / tokens seen",
        per_tokens_absent,
        tokens=tokens,
    )
    eta_s, eta_absent = _value(snapshot, "eta_s")
    if snapshot.final or snapshot.state == "finished":
        eta_s, eta_absent = None, "the run has ended"
    to_finish = eta_s / 3600.0 * n * rate if eta_s is not None and n is not None else None
    figures["to_finish"] = _figure(
        to_finish,
        cur,
        "ETA × GPUs × price",
        eta_absent or n_absent,
        eta_s=eta_s,
        gpus=n,
        price_per_gpu_hour=rate,
    )
    projected = spent + to_finish if spent is not None and to_finish is not None else None
    figures["projected"] = _figure(
        projected, cur, "money spent + cost to finish", hours_absent or eta_absent or n_absent
    )
    plan_hours, plan_absent = _value(snapshot, "plan_hours")
    figures["plan"] = _figure(
        plan_hours * n * rate if plan_hours is not None and n is not None else None,
        cur,
        "planned hours (--plan-hours) × GPUs × price",
        plan_absent or n_absent,
        plan_hours=plan_hours,
        gpus=n,
    )
    split: dict[str, dict[str, Any]] = {}
    lost = 0.0
    for part, seconds in snapshot.phases_s.items():
        value = seconds / 3600.0 * n * rate if n is not None else None
        entry = _figure(value, cur, f"{part_title(part)} s × GPUs × price / 3600", n_absent, seconds=seconds)
        entry["productive"] = part in PRODUCTIVE_PARTS
        split[part] = entry
        if value is not None and not entry["productive"]:
            lost += value
    figures["lost"] = _figure(
        lost if n is not None and split else None,
        cur,
        "Σ over the badput parts of the time split (every part but compute)",
        n_absent or (None if split else "no time split yet"),
    )
    doc: dict[str, Any] = {"price": price.doc(), "figures": figures, "split": split}
    if n is not None:
        nodes = len(snapshot.nodes)
        gpu_words = "1 GPU" if n == 1 else f"{n} GPUs"
        doc["scope"] = f"the job's {gpu_words} over {nodes} nodes" if nodes > 1 else f"the run's {gpu_words}"
    return doc


def overlay_of_summary(summary: Mapping[str, Any], price: Price | None) -> dict[str, Any]:
    """The overlay of a finished run's ``summary.json`` (its final snapshot), or the reason there is none."""
    if price is None:
        return {"absent": NO_PRICE}
    raw = summary.get("snapshot")
    if not isinstance(raw, Mapping):
        return {"absent": "the run's summary holds no snapshot", "price": price.doc()}
    import msgspec

    try:
        snapshot = msgspec.convert(dict(raw), records.Snapshot, strict=False)
    except msgspec.ValidationError as exc:
        return {"absent": f"the run's summary holds a snapshot tm cannot read ({exc})", "price": price.doc()}
    return overlay(snapshot, price)


def money_text(value: float, currency: str) -> str:
    """An amount as a person reads it: 2 decimals from 1 up, 3 significant digits below, with its currency."""
    if abs(value) >= 1:
        return f"{value:,.2f} {currency}"
    return f"{float(f'{value:.3g}'):g} {currency}"


def figure_text(figure: Mapping[str, Any]) -> str:
    """A figure's amount, or ``n/a (reason)``."""
    if "value" in figure:
        return money_text(figure["value"], figure["unit"])
    return f"n/a ({figure.get('absent', 'unknown')})"


#: The figures a line of words names, in order, and how each is said.
_WORDS = (
    ("spent", "spent {}"),
    ("per_1m_tokens", "{} per 1M tokens"),
    ("lost", "{} lost to badput"),
    ("to_finish", "{} to finish"),
    ("projected", "{} projected in all"),
    ("plan", "{} planned"),
)


def words(doc: Mapping[str, Any]) -> str:
    """An overlay in one line: the figures it has, then the price and its source (``spent 1.23 USD · ... · price 2.49
    USD/GPU-h from --price-per-gpu-hour``); without a price, its reason."""
    if "figures" not in doc:
        return f"money n/a ({doc.get('absent', NO_PRICE)})"
    figures = doc["figures"]
    parts = [
        text.format(money_text(figures[k]["value"], figures[k]["unit"]))
        for k, text in _WORDS
        if "value" in figures[k]
    ]
    if "value" not in figures["spent"]:
        parts.insert(0, f"money n/a ({figures['spent'].get('absent')})")
    scope = f" for {doc['scope']}" if doc.get("scope") else ""
    return " · ".join([*parts, doc["price"]["words"] + scope])


#: The figures ``tm compare`` sets side by side, with their titles.
_COMPARED = (
    ("spent", "money spent"),
    ("per_1m_tokens", "money per 1M tokens"),
    ("lost", "money lost to badput"),
    ("to_finish", "money to finish"),
    ("projected", "money projected in all"),
    ("plan", "money planned"),
)
#: Rows left out where no run has a value (finished runs have nothing to finish; few runs declare a plan).
_OPTIONAL_ROWS = frozenset({"money.to_finish", "money.projected", "money.plan"})


def comparison_rows(snapshots: list[records.Snapshot], price: Price | None) -> list[dict[str, Any]]:
    """Money's rows of ``tm compare`` (the headline's shape: values, reasons, difference and ratio against the first
    run), each run's snapshot at one price: the figures, then each badput part of any run's time split."""
    if price is None:
        return []
    docs = [overlay(s, price) for s in snapshots]
    wanted: list[tuple[str, str, Any]] = [
        (f"money.{key}", title, lambda d, key=key: d["figures"][key]) for key, title in _COMPARED
    ]
    parts: dict[str, None] = {}
    for doc in docs:
        # A part no run spent a second in is no row (a run without eval has no money lost to it).
        parts.update(
            {p: None for p, e in doc["split"].items() if not e["productive"] and e["inputs"]["seconds"]}
        )
    missing = {"absent": "not in this run's time split"}
    wanted += [
        (
            f"money.lost.{part}",
            f"money lost to {part_title(part)}",
            lambda d, part=part: d["split"].get(part, missing),
        )
        for part in parts
    ]
    rows = []
    for key, title, read in wanted:
        found = [read(doc) for doc in docs]
        values = [f.get("value") for f in found]
        if key in _OPTIONAL_ROWS and all(v is None for v in values):
            continue  # no row of n/a
        base = values[0]
        rows.append(
            {
                "key": key,
                "title": title,
                "unit": price.currency,
                "values": values,
                "absent": [
                    None if v is not None else f.get("absent") for v, f in zip(values, found, strict=True)
                ],
                "difference": [None]
                + [v - base if v is not None and base is not None else None for v in values[1:]],
                "ratio": [None] + [v / base if v is not None and base else None for v in values[1:]],
            }
        )
    return rows
