"""What each format sends for one alert, written out by hand from the services' documented payloads."""

from __future__ import annotations

import json
import math

from trainmeter_webhook.formats import outgoing
from trainmeter_webhook.settings import Settings

from trainmeter_core.model import records

RUN = {"name": "gpt-small", "run_id": "20270115T080000Z-n1-gpt-small", "host": "n1"}
FIRED = records.Alert(
    rule="loss_nan",
    state="fired",
    severity="critical",
    message="train_loss is nan at step 41 (1 NaN or infinite values so far)",
    numbers={"train_loss": math.nan, "step": 41.0},
    wall=1_800_000_003.0,
    episode=1,
)
TEXT = "tm gpt-small on n1: ALERT loss_nan (critical): train_loss is nan at step 41 (1 NaN or infinite values so far)"


def test_json_sends_the_run_the_text_and_every_field_of_the_alert():
    request = outgoing(FIRED, Settings(url="https://example.org/hook"), RUN)
    assert request.url == "https://example.org/hook"
    assert request.headers == {"Content-Type": "application/json; charset=utf-8"}
    assert json.loads(request.body) == {
        "source": "trainmeter",
        "run": "gpt-small",
        "run_id": "20270115T080000Z-n1-gpt-small",
        "host": "n1",
        "text": TEXT,
        "alert": {
            "rule": "loss_nan",
            "state": "fired",
            "severity": "critical",
            "message": FIRED.message,
            "numbers": {"train_loss": "NaN", "step": 41.0},  # JSON has no NaN: a string, as in the run log
            "subject": None,
            "episode": 1,
            "wall": 1_800_000_003.0,
        },
    }


def test_slack_sends_one_text_field():
    request = outgoing(FIRED, Settings(url="https://hooks.slack.com/services/T0/B0/x", format="slack"), RUN)
    assert json.loads(request.body) == {"text": TEXT}


def test_ntfy_sends_the_message_as_the_body_with_title_priority_and_tags():
    settings = Settings(url="https://ntfy.sh/my-runs", format="ntfy", token="tk_abc")
    request = outgoing(FIRED, settings, RUN)
    assert request.body == FIRED.message.encode()
    assert request.headers == {
        "Content-Type": "text/plain; charset=utf-8",
        "Title": "tm gpt-small: loss_nan fired",
        "Priority": "urgent",  # critical -> 5, urgent
        "Tags": "rotating_light",
        "Authorization": "Bearer tk_abc",
    }
    cleared = records.Alert(rule="loss_nan", state="cleared", severity="critical", message="finite again")
    headers = outgoing(cleared, Settings(url="https://ntfy.sh/my-runs", format="ntfy"), {"name": "ü"}).headers
    assert (headers["Priority"], headers["Tags"], headers["Title"]) == (
        "default",
        "white_check_mark",
        "tm ?: loss_nan cleared",
    )


def test_telegram_calls_send_message_of_the_bot_with_the_chat_and_the_text():
    settings = Settings(url="https://api.telegram.org", format="telegram", token="123:ABC", chat_id="-1001")
    request = outgoing(FIRED, settings, RUN)
    assert request.url == "https://api.telegram.org/bot123:ABC/sendMessage"
    assert json.loads(request.body) == {"chat_id": "-1001", "text": TEXT, "disable_web_page_preview": True}
    long = records.Alert(rule="x", state="fired", message="y" * 5000)
    assert len(json.loads(outgoing(long, settings, RUN).body)["text"]) == 4096
