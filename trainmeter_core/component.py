"""What a bus component is: a class with a name, the kinds it reads, and a run loop; and the context it runs in.

Where a component runs (a thread of the shared ``components`` process, or a process of its own) is a placement chosen
by the launcher, never a code change: a component only ever talks through its context.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from trainmeter_core import records as rec
from trainmeter_core.bus import Producer, Subscriber

ALL_KINDS = ("*",)
STOP_CHECK_S = 0.1


class Component:
    """Base class of every bus component.

    ``name`` identifies it in ``component`` records and on the command line; ``subscribes`` lists the kinds it reads
    (empty for a pure producer such as a sampler); ``shared`` says whether a built-in may run as a thread of the shared
    ``components`` process (third-party components always get their own process).
    """

    name: ClassVar[str] = ""
    subscribes: ClassVar[tuple[str, ...]] = ()
    shared: ClassVar[bool] = True

    def run(self, ctx: ComponentContext) -> None:
        raise NotImplementedError


class ComponentContext:
    """A component's window on the run: publish, read, the run's facts, and the stop signal."""

    def __init__(
        self, name: str, run_dir: Path, stopping: threading.Event, subscribes: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.run_dir = Path(run_dir)
        self.stopping = stopping
        endpoints = json.loads((self.run_dir / "endpoints.json").read_text())
        self.endpoints = endpoints
        self.meta: dict[str, Any] = json.loads((self.run_dir / "meta.json").read_text())
        self._producer = Producer(endpoints["in"], source=name, linger_ms=1000)
        # ("*",) subscribes to every kind; () to none (a pure producer such as a sampler).
        kinds = None if tuple(subscribes) == ALL_KINDS else subscribes
        self._subscriber = Subscriber(endpoints["out"], kinds) if subscribes else None

    @property
    def child_pid(self) -> int | None:
        return self.meta.get("child_pid")

    def publish(self, record: rec.Record) -> bool:
        return self._producer.send(record)

    def recv(self, timeout_s: float) -> rec.Record | rec.Unknown | None:
        """The next record, or None after at most ``timeout_s`` (and never more than 0.1 s, so a stop is noticed
        at once: the end of a run waits on it)."""
        if self._subscriber is None:
            self.stopping.wait(timeout_s)
            return None
        return self._subscriber.recv(min(timeout_s, STOP_CHECK_S))

    def records(self, timeout_s: float = 0.5) -> Iterator[rec.Record | rec.Unknown]:
        """Records of the subscribed kinds until the component is asked to stop."""
        while not self.stopping.is_set():
            record = self.recv(timeout_s)
            if record is not None:
                yield record

    def close(self) -> None:
        self._producer.close(reason="stop")
        if self._subscriber is not None:
            self._subscriber.close()
