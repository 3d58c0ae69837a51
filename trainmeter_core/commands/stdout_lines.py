"""tm's own output on stdout: a reader that went away (``| head -1``) ends it quietly."""

from __future__ import annotations

import sys


class Output:
    """stdout for tm's own output: a reader that went away (``| head -1``) ends it quietly."""

    def __init__(self) -> None:
        self.broken = False

    def line(self, text: str) -> None:
        if self.broken:
            return
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            self.broken = True
            # Stop the interpreter from complaining when it flushes stdout at exit.
            import os

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
