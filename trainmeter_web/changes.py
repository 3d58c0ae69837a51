"""What wakes the dashboard's live streams: ``Changes``, the version of the dashboard a stream waits on, moved by the
thread that feeds the dashboard and read on the server's event loop; ``HistoryWait``, how long a request waits for the
copy of the engine's history that its dashboard asked for late (docs/api.md, ``GET /api/series``). No aiohttp here:
plain asyncio, so both are tested without a server.
"""

from __future__ import annotations

import asyncio


class Changes:
    """Wakes every live stream when the dashboard changed, or when the server stops.

    ``changed`` is called by the one thread that changes the dashboard (the follower's), the rest on the event loop. A
    change moves ``version`` there and then, and wakes the event loop only where a stream waits for a change and no
    wake is on its way: with no page open, most of a run, a change costs the loop nothing. Waking it for each record
    that changed the dashboard (a self-pipe write, then a pass of the loop) took the web process about 2 ms of CPU a
    second on a tight loop, with no page open (docs/performance.md, "The web process with no page open")."""

    def __init__(self) -> None:
        self.version = 0
        self.closing = False
        self._waiters: set[asyncio.Future] = set()
        self._waking = False  # a wake is on its way to the event loop and has not run yet

    def changed(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """The dashboard changed (from the thread that changed it): a stream that comes to wait sees a new version,
        and those waiting are woken through ``loop`` (none before the server's loop runs). Raises RuntimeError where
        the loop closed meanwhile."""
        self.version += 1
        if loop is None or self._waking or not self._waiters:
            return
        self._waking = True
        try:
            loop.call_soon_threadsafe(self._woken)
        except RuntimeError:
            self._waking = False
            raise

    def close(self) -> None:
        self.closing = True
        self._wake()

    def _woken(self) -> None:
        self._waking = False
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait(self, seen: int, timeout_s: float) -> None:
        if self.version != seen or self.closing:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            # Once more, now that the waiter is in the set: a change between the first look and the add saw no
            # waiter, and so woke nothing (``changed`` moves the version before it looks at the waiters).
            if self.version == seen:
                await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)


class HistoryWait:
    """When a request first wanted the dashboard's copy of the engine's history (the event loop's clock; None while
    none has, and for a dashboard that wanted it from the start). A request that reads the copy within
    ``HISTORY_WAIT_S`` of that moment waits for it that long at most, so that the first state of the first page has
    its charts; a later one is served at once, with or without it."""

    def __init__(self) -> None:
        self.since: float | None = None
