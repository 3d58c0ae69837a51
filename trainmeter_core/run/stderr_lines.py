"""tm's own voice: one line per message on stderr, prefixed ``tm:`` (the launcher's notes, and the one line a command
that cannot go on ends with); a closed pipe silences it instead of raising.
"""

from __future__ import annotations

import sys


class Say:
    """tm's own lines on stderr; a closed pipe silences them instead of raising."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.broken = False

    def __call__(self, message: str, always: bool = False) -> None:
        if self.broken or (self.quiet and not always):
            return
        try:
            sys.stderr.write(f"tm: {message}\n")
            sys.stderr.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.broken = True
