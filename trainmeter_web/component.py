"""The ``web`` bus component: catches up from the engine's checkpoint and the log, then serves the dashboard on the
socket the launcher bound (``TM_WEB_FD``) while feeding its model from the bus.

It runs in a process of its own (aiohttp never enters the shared components process or a training process), and it
stops at once when asked: tm never waits for an open page at the end of a run.
"""

from __future__ import annotations

import os
import socket
import sys

from trainmeter_core.component import ALL_KINDS, Component, ComponentContext


class WebComponent(Component):
    name = "web"
    subscribes = ALL_KINDS
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
        from trainmeter_web.follow import Follower, open_run
        from trainmeter_web.guard import Guard
        from trainmeter_web.server import Server

        # dup: the launcher's descriptor stays open for the next incarnation whatever this one does with its copy.
        sock = socket.socket(fileno=os.dup(int(fd)))
        model, through_seq = open_run(ctx.run_dir)
        follower = Follower(model, ctx.recv, ctx.stopping, after_seq=through_seq)
        if not follower.catch_up():
            sock.close()
            return
        host = sock.getsockname()[0]
        server = Server(model, sock, Guard(host, os.environ.get("TM_WEB_TOKEN") or None))
        server.start()
        try:
            follower.run_live(server.notify)
        finally:
            server.stop()
