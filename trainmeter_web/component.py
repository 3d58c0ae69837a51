"""The ``web`` bus component: follows the run (its own parts from the log through the one hand-over, the numbers from
the run's engine), then serves the dashboard on the socket the launcher bound (``TM_WEB_FD``) while feeding its
DashboardState from the bus.

It runs in a process of its own (aiohttp never enters the shared components process or a training process), it never
builds an engine (the engine component is the run's one), and it stops at once when asked: tm never waits for an open
page at the end of a run.
"""

from __future__ import annotations

import os
import socket
import sys

from trainmeter_core.bus.component import ALL_KINDS_WITH_BLOCKS, Component, ComponentContext
from trainmeter_core.model import records


class WebComponent(Component):
    name = "web"
    subscribes = ALL_KINDS_WITH_BLOCKS  # the dashboard takes a block whole: no step of it is built
    shared = False

    def run(self, ctx: ComponentContext) -> None:
        fd = os.environ.get("TM_WEB_FD")
        if not fd:
            print(
                "tm: web component started without TM_WEB_FD: the launcher binds the dashboard's socket",
                file=sys.stderr,
            )
            ctx.stopping.wait()
            return
        from trainmeter_web.dashboard_state import DashboardState
        from trainmeter_web.follow import Follower, read_meta
        from trainmeter_web.guard import Guard
        from trainmeter_web.server import Server

        # dup: the launcher's descriptor stays open for the next incarnation whatever this one does with its copy.
        sock = socket.socket(fileno=os.dup(int(fd)))
        # The engine's history is asked for once a page or an API client comes (Server: want_history), not before.
        dashboard = DashboardState(ctx.run_dir, read_meta(ctx.run_dir), price=_price(), history_wanted=False)
        follower = Follower(
            dashboard,
            ctx.recv,
            ctx.stopping,
            lambda reason: ctx.publish(records.HistoryRequest(reason=reason)),
        )
        if not follower.catch_up():
            sock.close()
            return
        host = sock.getsockname()[0]
        server = Server(dashboard, sock, Guard(host, os.environ.get("TM_WEB_TOKEN") or None))
        server.start()
        try:
            follower.run_live(server.notify)
        finally:
            server.stop()


def _price():
    """The price tm was given for this run (flag, environment or tm.toml, resolved by the launcher and handed to this
    process alone), or None; a price the launcher let through is never refused here, but say so if it is."""
    from trainmeter_core.model import money

    try:
        return money.from_environ(os.environ)
    except money.PriceError as exc:
        print(f"tm: dashboard shows no money: {exc}", file=sys.stderr)
        return None
