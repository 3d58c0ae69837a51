"""The webhook's settings from the environment: off without a URL, one line naming the variable when one is wrong,
and the URL and token declared secret so tm redacts them everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from trainmeter_webhook import plugin
from trainmeter_webhook.settings import SECRETS, Settings, SettingsError, from_env

from trainmeter_core.model.redaction import redact_argv, redact_env


def test_no_url_no_webhook():
    assert from_env({}) is None and from_env({"TM_WEBHOOK_FORMAT": "slack"}) is None


def test_a_url_alone_is_the_generic_json_format_with_the_defaults():
    assert from_env({"TM_WEBHOOK_URL": "https://example.org/h"}) == Settings(url="https://example.org/h")


def test_telegram_builds_on_the_bot_api_by_default():
    settings = from_env(
        {"TM_WEBHOOK_FORMAT": "telegram", "TM_WEBHOOK_TOKEN": "1:A", "TM_WEBHOOK_CHAT_ID": "9"}
    )
    assert (settings.url, settings.token, settings.chat_id) == ("https://api.telegram.org", "1:A", "9")
    assert settings.secrets() == ["https://api.telegram.org", "1:A", "9"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TM_WEBHOOK_URL": "https://x", "TM_WEBHOOK_FORMAT": "teams"},
            "TM_WEBHOOK_FORMAT (--webhook-format) 'teams': accepted: json, slack, ntfy, telegram",
        ),
        (
            {"TM_WEBHOOK_URL": "ftp://x"},
            "TM_WEBHOOK_URL (--webhook-url): expected an http:// or https:// address",
        ),
        (
            {"TM_WEBHOOK_FORMAT": "telegram", "TM_WEBHOOK_URL": "https://x"},
            "telegram needs the bot token: set TM_WEBHOOK_TOKEN (--webhook-token)",
        ),
        (
            {"TM_WEBHOOK_FORMAT": "telegram", "TM_WEBHOOK_TOKEN": "1:A"},
            "telegram needs the chat to write to: set TM_WEBHOOK_CHAT_ID (--webhook-chat-id)",
        ),
        (
            {"TM_WEBHOOK_URL": "https://x", "TM_WEBHOOK_RETRIES": "many"},
            "TM_WEBHOOK_RETRIES='many': expected a number from 0 to 100",
        ),
        (
            {"TM_WEBHOOK_URL": "https://x", "TM_WEBHOOK_STATES": "fired,gone"},
            "TM_WEBHOOK_STATES: accepted: fired, cleared, or fired,cleared",
        ),
    ],
)
def test_a_wrong_setting_is_one_line_naming_it(env, message):
    with pytest.raises(SettingsError) as caught:
        from_env(env)
    assert str(caught.value) == message


def test_the_url_and_the_token_are_redacted_by_tms_own_redaction():
    argv = ["--webhook-url", "https://example.org/hook/abc", "--webhook-token=t0ken", "train.py"]
    assert redact_argv(argv, SECRETS) == ["--webhook-url", "***", "--webhook-token=***", "train.py"]
    env = {"TM_WEBHOOK_URL": "https://example.org/hook/abc", "TM_WEBHOOK_FORMAT": "json"}
    assert redact_env(env, SECRETS) == {"TM_WEBHOOK_URL": "***", "TM_WEBHOOK_FORMAT": "json"}
    assert plugin.trainmeter_secret_options() == SECRETS


def test_the_options_set_the_variables_the_sink_reads():
    import argparse

    parser = argparse.ArgumentParser()
    plugin.trainmeter_add_options(parser)
    args = parser.parse_args(["--webhook-url", "https://x/h", "--webhook-format", "ntfy"])
    assert {k: v for k, v in vars(args).items() if v is not None} == {
        "TM_WEBHOOK_URL": "https://x/h",
        "TM_WEBHOOK_FORMAT": "ntfy",
    }


def test_the_sink_is_listed_only_when_a_webhook_is_asked_for(monkeypatch):
    monkeypatch.delenv("TM_WEBHOOK_URL", raising=False)
    monkeypatch.delenv("TM_WEBHOOK_TOKEN", raising=False)
    assert plugin.trainmeter_sinks() == []
    monkeypatch.setenv("TM_WEBHOOK_URL", "https://x/h")
    assert [c.name for c in plugin.trainmeter_sinks()] == ["webhook"]


def test_without_a_url_the_sink_is_neither_listed_nor_imported():
    """tm lists the sinks in its launcher and components process: without a webhook, the plugin adds none and loads
    nothing of the sink (its delivery imports urllib.request, 10 to 20 ms). In a fresh interpreter."""
    code = (
        "import sys\n"
        "from trainmeter_webhook import plugin\n"
        "print(plugin.trainmeter_sinks(), 'trainmeter_webhook.sink' in sys.modules, 'urllib.request' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_WEBHOOK_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "False", "False"]
