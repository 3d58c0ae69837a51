"""The ``tm`` subcommands plugins provide (``trainmeter_commands``): every one offered, and the one of a name.

A leaf of the commands: ``cli`` dispatches to them, and ``view`` and ``compare`` let a plugin (the dashboard) complete
their built-in command; it imports none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Collection


def plugin_commands() -> list[tuple[str, object]]:
    """(plugin name, command) for every ``tm`` subcommand the loaded plugins provide (``trainmeter_commands``)."""
    from trainmeter_core import plugins as plugins_mod

    return [
        (plugin_name, command)
        for plugin_name, commands in plugins_mod.load().per_plugin("trainmeter_commands")
        for command in commands
        if isinstance(getattr(command, "name", None), str)
    ]


def plugin_command(name: str, builtin_names: Collection[str] = (), offered: list | None = None):
    """The plugin's command of this name, or None. A plugin completes a built-in command (the dashboard serves
    ``tm view``) unless ``builtin_names`` holds the name: then tm's own wins, and one line says the plugin's is ignored.
    """
    for plugin_name, command in plugin_commands() if offered is None else offered:
        if command.name == name:
            if name in builtin_names:
                print(
                    f"tm: plugin {plugin_name} offers `tm {name}`, which tm itself has: ignored",
                    file=sys.stderr,
                )
                return None
            return command
    return None
