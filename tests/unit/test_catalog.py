"""The alias catalog: raw keys to canonical series, exactly as SPEC.md's table says, and nothing renamed by guess."""

from __future__ import annotations

import pytest

from trainmeter_core.model.catalog import ALIASES, CANONICAL, canonical, is_explicit_train_key, is_loss


@pytest.mark.parametrize(
    ("raw_key", "expected"),
    [
        ("train_loss", "train_loss"),
        ("train/loss", "train_loss"),
        ("loss/train", "train_loss"),
        ("training_loss", "train_loss"),
        ("val_loss", "val_loss"),
        ("val/loss", "val_loss"),
        ("loss/val", "val_loss"),
        ("eval_loss", "val_loss"),
        ("eval/loss", "val_loss"),
        ("valid_loss", "val_loss"),
        ("validation_loss", "val_loss"),
        ("lr", "lr"),
        ("learning_rate", "lr"),
        ("train/lr", "lr"),
        ("train/learning_rate", "lr"),
        ("grad_norm", "grad_norm"),
        ("train/grad_norm", "grad_norm"),
        ("gradient_norm", "grad_norm"),
    ],
)
def test_every_alias_of_the_spec_maps_to_its_canonical_series(raw_key, expected):
    assert canonical(raw_key, seen_explicit_train=False) == expected
    assert canonical(raw_key, seen_explicit_train=True) == expected


def test_a_bare_loss_is_the_train_loss_until_an_explicit_train_key_was_seen():
    assert canonical("loss", seen_explicit_train=False) == "train_loss"
    assert canonical("loss", seen_explicit_train=True) == "loss"


def test_other_keys_are_custom_series_under_their_own_name():
    assert canonical("tokens_per_batch", seen_explicit_train=False) == "tokens_per_batch"
    assert canonical("train/acc", seen_explicit_train=False) == "train/acc"
    # Keys are matched exactly: a loop's "Train_Loss" is its own series, never guessed into train_loss.
    assert canonical("Train_Loss", seen_explicit_train=False) == "Train_Loss"


def test_only_the_train_loss_aliases_are_explicit_train_keys():
    assert is_explicit_train_key("train/loss")
    assert not is_explicit_train_key("loss")
    assert not is_explicit_train_key("val_loss")


def test_the_alias_table_has_no_key_claimed_by_two_series():
    total = sum(len(raws) for raws in CANONICAL.values())
    assert len(ALIASES) == total == 18


@pytest.mark.parametrize(
    ("name", "loss"),
    [
        ("train_loss", True),
        ("val_loss", True),
        ("loss", True),  # a bare loss after an explicit train key: a custom series, still a loss
        ("aux_loss", True),
        ("loss/mlm", True),
        ("eval/z-loss", True),
        ("Train/Loss_MLM", True),
        ("lr", False),
        ("grad_norm", False),
        ("lossless_ratio", False),
        ("gloss", False),
        ("accuracy", False),
        ("tm:rank:0:step_time_s", False),
    ],
)
def test_a_series_is_a_loss_by_its_canonical_name_or_the_word_loss_in_its_own(name, loss):
    assert is_loss(name) is loss
