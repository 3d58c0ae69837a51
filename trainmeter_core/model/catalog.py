"""The alias catalog: which raw key a loop reports maps to which canonical series (train_loss, val_loss, lr, ...).

Pure: no I/O, no clock, no state. It must never rename a key it does not know: any other key is a custom series
under its own name, and a bare ``loss`` is train_loss only while no explicit train key was seen.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["ALIASES", "BARE_LOSS", "CANONICAL", "LOSSES", "canonical", "is_explicit_train_key", "is_loss"]

#: The canonical series and the raw keys that mean them (SPEC.md, "Series the loop reports").
CANONICAL: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "train_loss": ("train_loss", "train/loss", "loss/train", "training_loss"),
        "val_loss": (
            "val_loss",
            "val/loss",
            "loss/val",
            "eval_loss",
            "eval/loss",
            "valid_loss",
            "validation_loss",
        ),
        "lr": ("lr", "learning_rate", "train/lr", "train/learning_rate"),
        "grad_norm": ("grad_norm", "train/grad_norm", "gradient_norm"),
    }
)

#: raw key -> canonical name, for every explicit alias (matched exactly: a loop's keys are case-sensitive names).
ALIASES: Mapping[str, str] = MappingProxyType({raw: name for name, raws in CANONICAL.items() for raw in raws})

#: The key that is train_loss only until the loop names its train loss explicitly (then "loss" is its own series).
BARE_LOSS = "loss"

_EXPLICIT_TRAIN_KEYS = frozenset(CANONICAL["train_loss"])
#: The canonical series that are losses; a custom series is one when a word of its name is "loss" (below).
LOSSES = frozenset({"train_loss", "val_loss"})
_WORDS = re.compile(r"[^0-9A-Za-z]+")


def is_explicit_train_key(raw_key: str) -> bool:
    """True for a raw key that names the train loss explicitly (``train_loss``, ``train/loss``, ...)."""
    return raw_key in _EXPLICIT_TRAIN_KEYS


def canonical(raw_key: str, seen_explicit_train: bool) -> str:
    """The canonical series for ``raw_key``; the key itself for a custom series.

    A bare ``loss`` is ``train_loss`` while ``seen_explicit_train`` is False. Once a loop reported an explicit train
    key, its bare ``loss`` means something else (an eval loss, a sum of losses) and stays a custom series ``loss``.
    """
    name = ALIASES.get(raw_key)
    if name is not None:
        return name
    if raw_key == BARE_LOSS and not seen_explicit_train:
        return "train_loss"
    return raw_key


def is_loss(name: str) -> bool:
    """True for a series that is a loss: ``train_loss``, ``val_loss``, or a series of the loop's own whose name has the
    word ``loss`` (``loss``, ``aux_loss``, ``loss/mlm``, ``eval/z-loss``; not ``lossless_ratio`` nor ``gloss``).

    ``name`` is a canonical name (``canonical``'s answer, a snapshot's ``series`` key); tm's own series (``tm:...``)
    are never losses."""
    if name in LOSSES:
        return True
    if name.startswith("tm:"):
        return False
    return "loss" in _WORDS.split(name.lower())
