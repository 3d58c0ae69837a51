"""Off by default, loopback unless told otherwise, each bad setting one line naming its option; the hooks as tm sees
them through its plugin manager."""

from __future__ import annotations

import argparse

import pytest
from trainmeter_prometheus import plugin, settings

from trainmeter_core.plugins import Plugins


def test_without_a_port_there_is_no_exporter():
    assert settings.from_env({}) is None
    assert settings.from_env({"TM_PROMETHEUS_PORT": "  "}) is None


def test_a_port_alone_listens_on_loopback():
    got = settings.from_env({"TM_PROMETHEUS_PORT": "9464"})
    assert got == settings.Settings(port=9464, host="127.0.0.1")
    assert got.url() == "http://127.0.0.1:9464/metrics"


def test_another_address_is_only_used_when_named():
    got = settings.from_env({"TM_PROMETHEUS_PORT": "0", "TM_PROMETHEUS_HOST": "0.0.0.0"})
    assert got == settings.Settings(port=0, host="0.0.0.0")
    assert settings.from_env({"TM_PROMETHEUS_PORT": "9464", "TM_PROMETHEUS_HOST": "[::1]"}).url() == (
        "http://[::1]:9464/metrics"
    )


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        (
            {"TM_PROMETHEUS_PORT": "http"},
            "TM_PROMETHEUS_PORT (--prometheus-port) 'http': expected a port from 0",
        ),
        ({"TM_PROMETHEUS_PORT": "70000"}, "expected a port from 0 to 65535"),
        ({"TM_PROMETHEUS_PORT": "-1"}, "expected a port from 0 to 65535"),
        (
            {"TM_PROMETHEUS_HOST": "0.0.0.0"},
            "TM_PROMETHEUS_HOST (--prometheus-host) is set but TM_PROMETHEUS_PORT",
        ),
        ({"TM_PROMETHEUS_PORT": "1", "TM_PROMETHEUS_HOST": "http://x/"}, "expected an address to listen on"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable_and_its_option(environ, words):
    with pytest.raises(settings.SettingsError) as caught:
        settings.from_env(environ)
    message = str(caught.value)
    assert words in message and "\n" not in message


def registered() -> Plugins:
    plugins = Plugins()
    plugins.register(plugin, name="prometheus")  # pluggy checks each hookimpl against its hookspec
    return plugins


def test_the_sink_is_offered_only_when_a_port_was_given(monkeypatch):
    monkeypatch.delenv("TM_PROMETHEUS_PORT", raising=False)
    monkeypatch.delenv("TM_PROMETHEUS_HOST", raising=False)
    assert registered().per_plugin("trainmeter_sinks") == [("prometheus", [])]
    monkeypatch.setenv("TM_PROMETHEUS_PORT", "9464")
    ((name, classes),) = registered().per_plugin("trainmeter_sinks")
    assert [(c.name, c.subscribes, c.shared) for c in classes] == [
        ("prometheus", ("snapshot", "sample.gpu", "bus.stats", "alert", "step", "component"), False)
    ]
    # a bad port: still offered, so that it starts, says why in one line, and idles
    monkeypatch.setenv("TM_PROMETHEUS_PORT", "not a port")
    offered = [c.name for _, classes in registered().per_plugin("trainmeter_sinks") for c in classes]
    assert offered == ["prometheus"]


def test_the_options_set_the_variables_the_exporter_reads():
    parser = argparse.ArgumentParser()
    registered().per_plugin("trainmeter_add_options", parser=parser)
    args = parser.parse_args(
        [
            "--prometheus-port",
            "9464",
            "--prometheus-host",
            "0.0.0.0",
            "--prometheus-price-per-gpu-hour",
            "2.49",
        ]
    )
    assert vars(args) == {
        "TM_PROMETHEUS_PORT": "9464",
        "TM_PROMETHEUS_HOST": "0.0.0.0",
        "TM_PROMETHEUS_PRICE_PER_GPU_HOUR": "2.49",
        "TM_PROMETHEUS_PRICE_CURRENCY": None,
    }
    assert set(vars(parser.parse_args([])).values()) == {None}


# ----------------------------------------------------------------------------------------------------------------------
# The price money on /metrics is at: the exporter's own setting, else the run's as tm handed it on, else none


def test_without_a_price_the_exporter_has_none():
    assert settings.from_env({"TM_PROMETHEUS_PORT": "9464"}).price is None


def test_the_exporters_own_price_beats_the_runs():
    got = settings.from_env(
        {
            "TM_PROMETHEUS_PORT": "9464",
            "TM_PROMETHEUS_PRICE_PER_GPU_HOUR": "7.3193",
            "TM_PROMETHEUS_PRICE_CURRENCY": "eur",
            "TM_PRICE_PER_GPU_HOUR": "2.49",
            "TM_PRICE_FROM": "--price-per-gpu-hour",
        }
    ).price
    assert (got.per_gpu_hour, got.currency) == (7.3193, "EUR")
    assert got.source == "TM_PROMETHEUS_PRICE_PER_GPU_HOUR (--prometheus-price-per-gpu-hour)"


def test_the_runs_price_keeps_the_source_tm_resolved():
    got = settings.from_env(
        {
            "TM_PROMETHEUS_PORT": "9464",
            "TM_PRICE_PER_GPU_HOUR": "2.49",
            "TM_PRICE_FROM": "--price-per-gpu-hour",
        }
    ).price
    assert (got.per_gpu_hour, got.currency, got.currency_given, got.source) == (
        2.49,
        "USD",
        False,
        "--price-per-gpu-hour",
    )


def test_a_bad_price_is_one_line_naming_the_variable_but_not_the_digits_the_run_log_would_keep():
    with pytest.raises(settings.SettingsError) as caught:
        settings.from_env({"TM_PROMETHEUS_PORT": "9464", "TM_PROMETHEUS_PRICE_PER_GPU_HOUR": "7.3193x"})
    assert (
        str(caught.value)
        == "TM_PROMETHEUS_PRICE_PER_GPU_HOUR: give a positive number per GPU-hour such as 2.49"
    )
