"""The plugin tm loads through the ``trainmeter`` entry point: the webhook sink, its options, and which are secret.

Nothing in tm names this plugin; installing the distribution is what makes tm find it. The sink is only listed when a
webhook was asked for, so a run without one starts no process for it.
"""

from __future__ import annotations

from trainmeter_core.api import hookimpl
from trainmeter_webhook import settings


@hookimpl
def trainmeter_sinks():
    try:
        wanted = settings.from_env() is not None
    except settings.SettingsError:
        wanted = True  # the sink starts, says what is wrong in one line, and stops
    if not wanted:
        return []  # nothing imported: the sink loads urllib.request, 10 to 20 ms of every tm process that lists sinks
    from trainmeter_webhook.sink import WebhookSink

    return [WebhookSink]


@hookimpl
def trainmeter_secret_options():
    return list(settings.SECRETS)


@hookimpl
def trainmeter_add_options(parser):
    # Each option's dest is the variable it sets, so the components see options and variables alike.
    group = parser.add_argument_group("webhook (trainmeter-webhook)")
    group.add_argument("--webhook-url", dest="TM_WEBHOOK_URL", metavar="URL", help="where to POST each alert")
    group.add_argument(
        "--webhook-format", dest="TM_WEBHOOK_FORMAT", choices=settings.FORMATS, help="default json"
    )
    group.add_argument("--webhook-token", dest="TM_WEBHOOK_TOKEN", metavar="TOKEN", help="Telegram bot token")
    group.add_argument("--webhook-chat-id", dest="TM_WEBHOOK_CHAT_ID", metavar="ID", help="Telegram chat id")
