"""The errors that end a ``tm`` command early: each carries the one line a user reads and tm's exit status, 2 for a
command line tm cannot take, 126 or 127 for a command that cannot start (as a shell says them). They are raised where
the problem is found and printed once, at the command's edge (``commands/cli.py``); this module imports nothing.
"""

from __future__ import annotations

#: A command line tm cannot take (a wrong option or value, a run that is not there or cannot be written).
USAGE = 2
#: The command was found but cannot be executed (a folder, a file without the execute bit).
NOT_EXECUTABLE = 126
#: The command or script is not there.
NOT_FOUND = 127


class TmError(Exception):
    """One line for a user (its ``str``) and the exit status tm ends with; never a traceback."""

    exit_status: int = USAGE

    def __init__(self, line: str, exit_status: int | None = None) -> None:
        super().__init__(line)
        if exit_status is not None:
            self.exit_status = exit_status


class UsageError(TmError):
    """A command line tm cannot take: one line, exit 2."""

    exit_status = USAGE


class CommandNotStartable(TmError):
    """The command cannot start: 127 when it is not there, 126 when it is there but cannot be executed."""

    @classmethod
    def not_found(cls, line: str) -> CommandNotStartable:
        return cls(line, NOT_FOUND)

    @classmethod
    def not_executable(cls, line: str) -> CommandNotStartable:
        return cls(line, NOT_EXECUTABLE)
