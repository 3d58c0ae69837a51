"""trainmeter-webhook: a sink that POSTs each trainmeter alert to a URL (generic JSON, Slack, ntfy, Telegram)."""

__version__ = "0.1.0"
