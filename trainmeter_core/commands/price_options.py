"""The price options every view of money shares (``tm``, ``tm view``, ``tm report``, ``tm compare``, ``tm runs``):
``--price-per-gpu-hour`` and ``--price-currency``, then ``TM_PRICE_PER_GPU_HOUR``, then tm.toml's
``price_per_gpu_hour``, resolved by ``model/money.py``. A bad price is a ``UsageError``; the price is never written.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from trainmeter_core.errors import UsageError
from trainmeter_core.model import money


def add_price_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        money.PRICE_FLAG,
        dest="price_per_gpu_hour",
        metavar="PRICE",
        help=(
            f"a price per GPU-hour (such as 2.49) to show money with; beats {money.PRICE_ENV} and tm.toml's "
            f"{money.PRICE_KEY}; never stored"
        ),
    )
    parser.add_argument(
        money.CURRENCY_FLAG,
        dest="price_currency",
        metavar="CODE",
        help=f"the price's currency (default {money.DEFAULT_CURRENCY})",
    )


def price_from(
    args: argparse.Namespace, folder: Path | None = None, environ: Mapping[str, str] | None = None
) -> money.Price | None:
    """The price a command was given (flag > environment > the tm.toml in ``folder``, else the working folder's)."""
    from trainmeter_core.model.declared import DeclaredInputError, load_tm_toml

    toml_path = (folder or Path.cwd()) / "tm.toml"
    try:
        document = load_tm_toml(toml_path) if toml_path.is_file() else {}
        return money.resolve(
            getattr(args, "price_per_gpu_hour", None),
            getattr(args, "price_currency", None),
            os.environ if environ is None else environ,
            document,
            str(toml_path),
        )
    except (money.PriceError, DeclaredInputError) as exc:
        raise UsageError(str(exc)) from None
