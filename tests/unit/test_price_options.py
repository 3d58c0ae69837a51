"""The price options of tm's commands (commands/price_options.py): ``tm``'s flag, the environment and the tm.toml next
to the script, resolved once by the launcher and handed to its components alone; never a declared fact, and never in
the environment a run records."""

from __future__ import annotations

import argparse

import pytest

from trainmeter_core.commands.cli import run_options
from trainmeter_core.commands.price_options import add_price_arguments, price_from
from trainmeter_core.errors import UsageError
from trainmeter_core.run.identity import selected_env


@pytest.fixture
def script(tmp_path, monkeypatch):
    for name in ("TM_PRICE_PER_GPU_HOUR", "TM_PRICE_CURRENCY", "TM_PRICE_FROM"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def test_the_runs_flag_goes_to_the_components_with_its_source(script):
    opts = run_options(["--price-per-gpu-hour", "7.3193", "--price-currency", "EUR", str(script)])
    assert opts.component_env == {
        "TM_PRICE_PER_GPU_HOUR": "7.3193",
        "TM_PRICE_CURRENCY": "EUR",
        "TM_PRICE_FROM": "--price-per-gpu-hour",
    }
    assert opts.command == [str(script)]  # the flag is tm's, never the script's


def test_a_price_in_the_tm_toml_next_to_the_script_is_the_runs_and_no_declared_fact(script):
    (script.parent / "tm.toml").write_text("price_per_gpu_hour = 7.3193\nlayers = 4\n")
    opts = run_options([str(script)])
    assert opts.component_env["TM_PRICE_FROM"] == f"tm.toml price_per_gpu_hour ({script.parent / 'tm.toml'})"
    assert "TM_PRICE_CURRENCY" not in opts.component_env  # the default currency stays a default
    assert list(opts.declared) == ["layers"]


def test_the_environment_beats_tm_toml_and_the_flag_beats_both(script, monkeypatch):
    (script.parent / "tm.toml").write_text("price_per_gpu_hour = 1.5\n")
    monkeypatch.setenv("TM_PRICE_PER_GPU_HOUR", "3.25")
    assert run_options([str(script)]).component_env["TM_PRICE_FROM"] == "TM_PRICE_PER_GPU_HOUR"
    flagged = run_options(["--price-per-gpu-hour", "7.3193", str(script)]).component_env
    assert (flagged["TM_PRICE_PER_GPU_HOUR"], flagged["TM_PRICE_FROM"]) == ("7.3193", "--price-per-gpu-hour")


def test_without_a_price_nothing_is_handed_on(script):
    assert run_options([str(script)]).component_env == {}


def test_a_bad_price_stops_tm_before_the_run_in_one_line(script):
    with pytest.raises(
        UsageError, match=r"^--price-per-gpu-hour '2,49': give a positive number per GPU-hour"
    ):
        run_options(["--price-per-gpu-hour", "2,49", str(script)])


def test_the_views_read_the_tm_toml_of_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("TM_PRICE_PER_GPU_HOUR", raising=False)
    (tmp_path / "tm.toml").write_text('[run]\nprice_per_gpu_hour = "2.49"\nprice_currency = "chf"\n')
    parser = argparse.ArgumentParser()
    add_price_arguments(parser)
    monkeypatch.chdir(tmp_path)
    price = price_from(parser.parse_args([]))
    assert (price.per_gpu_hour, price.currency, price.source) == (
        2.49,
        "CHF",
        f"tm.toml price_per_gpu_hour ({tmp_path / 'tm.toml'})",
    )


def test_price_variables_stay_out_of_the_environment_a_run_records(monkeypatch):
    monkeypatch.setenv("TM_PRICE_PER_GPU_HOUR", "7.3193")
    monkeypatch.setenv("TM_PROMETHEUS_PRICE_PER_GPU_HOUR", "7.3193")
    monkeypatch.setenv("TM_PRICE_FROM", "--price-per-gpu-hour")
    monkeypatch.setenv("TM_GPU_INTERVAL_S", "0.5")
    recorded = selected_env([])
    assert recorded["TM_GPU_INTERVAL_S"] == "0.5"
    assert not [name for name in recorded if "PRICE" in name]
