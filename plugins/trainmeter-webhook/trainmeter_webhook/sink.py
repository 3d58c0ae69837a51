"""The webhook sink: a bus component that reads ``alert`` records and POSTs each one to the configured URL.

It runs in a process of its own (tm gives every plugin's component one), reads the bus in one thread and delivers in
another through a bounded queue, so a slow or dead receiver never holds anything up: a full queue drops the alert and
says so. A delivery that fails after its retries is a warning (a ``notice`` on the bus and a line on stderr), never
an error of the run. The URL and token appear in no record, file or message.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

from trainmeter_core.api import Alert, ComponentContext, Notice, Sink, alerts_until_stopped
from trainmeter_webhook import settings as settings_mod
from trainmeter_webhook.delivery import deliver, scrub
from trainmeter_webhook.formats import outgoing

QUEUE_MAX = 100
#: After the bus is drained at stop, how long alerts still queued may take to go out (tm kills at 3 s).
STOP_DELIVERY_S = 1.0


class WebhookSink(Sink):
    name = "webhook"
    subscribes = ("alert",)
    shared = False

    def run(self, ctx: ComponentContext) -> None:
        try:
            settings = settings_mod.from_env()
        except settings_mod.SettingsError as exc:
            say(ctx, f"webhook off: {exc}", "error")
            return
        if settings is None:
            return
        run = {"name": ctx.meta.get("name"), "run_id": ctx.meta.get("run_id"), "host": ctx.meta.get("host")}
        pending: queue.Queue[Alert | None] = queue.Queue(maxsize=QUEUE_MAX)
        hurry = threading.Event()  # set at stop: backoffs end early, what is left is given up

        def deliver_all() -> None:
            while True:
                alert = pending.get()
                if alert is None:
                    return
                result = deliver(
                    outgoing(alert, settings, run),
                    timeout_s=settings.timeout_s,
                    retries=settings.retries,
                    backoff_s=settings.backoff_s,
                    secrets=settings.secrets(),
                    wait=hurry.wait,
                )
                if not result.ok:
                    word = "attempt" if result.attempts == 1 else "attempts"
                    say(
                        ctx,
                        f"webhook gave up on alert {alert.rule} {alert.state} after {result.attempts} {word}: "
                        f"{result.error}",
                    )

        worker = threading.Thread(target=deliver_all, name="tm-webhook-delivery", daemon=True)
        worker.start()
        dropped = 0
        for alert in alerts_until_stopped(ctx):
            if alert.state not in settings.states:
                continue
            try:
                pending.put_nowait(alert)
            except queue.Full:
                dropped += 1
                if dropped == 1:
                    say(
                        ctx,
                        f"webhook queue full ({QUEUE_MAX} alerts waiting): dropping alerts until it drains",
                    )
        deadline = time.monotonic() + STOP_DELIVERY_S
        while not pending.empty() and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        hurry.set()
        left = pending.qsize()
        try:
            pending.put_nowait(None)
        except queue.Full:
            pass
        worker.join(max(0.0, deadline - time.monotonic()) + 0.5)
        if left or dropped:
            say(ctx, f"webhook: {left + dropped} alerts not delivered (the run ended or the queue was full)")


def say(ctx: ComponentContext, message: str, level: str = "warning") -> None:
    """A notice on the bus (so the run log and the dashboard have it) and one line on tm's stderr."""
    try:
        secrets = settings_mod.from_env()
    except settings_mod.SettingsError:
        secrets = None
    message = scrub(message, secrets.secrets() if secrets else [])
    ctx.publish(Notice(level=level, topic="webhook", message=message))  # type: ignore[arg-type]
    try:
        sys.stderr.write(f"tm: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
