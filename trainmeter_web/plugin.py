"""The dashboard's registration: the ``web`` component, ``tm view``, ``tm report`` and ``tm compare -o``, through the
``trainmeter`` entry point a third-party plugin uses.

It must import nothing heavy: aiohttp is imported only when the web process starts serving.
"""

from __future__ import annotations

from trainmeter_core import hookimpl


@hookimpl
def trainmeter_components():
    from trainmeter_web.component import WebComponent

    return [WebComponent]


@hookimpl
def trainmeter_commands():
    from trainmeter_web.compare import CompareCommand
    from trainmeter_web.report import ReportCommand
    from trainmeter_web.view import ViewCommand

    return [ViewCommand(), ReportCommand(), CompareCommand()]
