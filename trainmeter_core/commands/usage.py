"""What every ``tm`` subcommand shares: the one-line usage error (exit 2) and its argument parser.

No option is ever abbreviated (``--budget-token`` is not ``--budget-tokens``): a misspelt one is an error that names
the nearest real one. Nothing here prints; ``tm``'s edge turns a ``UsageError`` (``trainmeter_core.errors``) into one
line on stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from trainmeter_core.errors import UsageError


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice a typo most likely meant: one the word begins (a cut-off name), else the closest spelling."""
    choices = sorted(set(choices))
    extended = [c for c in choices if c.startswith(word) and len(word) >= 3]
    if len(extended) == 1:
        return extended[0]
    import difflib  # only for a typo: every start would pay for it

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for action in parser._actions for opt in action.option_strings]


def unknown_option(token: str, parser: argparse.ArgumentParser, help_hint: str) -> UsageError:
    """The error for an option the parser does not have, naming the one it most likely meant."""
    name = token.split("=", 1)[0]
    guess = nearest(name, [o for o in option_strings(parser) if o.startswith("--")])
    hint = f": did you mean {guess}?" if guess else ""
    return UsageError(f"unknown option {name}{hint} ({help_hint})")


class ArgumentParser(argparse.ArgumentParser):
    """argparse without abbreviations, whose every error is one line (a ``UsageError``) naming the fix."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            token = extras[0]
            if token.startswith("-") and token != "-":
                raise unknown_option(token, self, f"{self.prog} --help")
            raise UsageError(f"unexpected argument {token} ({self.prog} --help)")
        return namespace

    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} ({self.prog} --help)")


def parser_for(prog: str, description: str) -> ArgumentParser:
    return ArgumentParser(prog=f"tm {prog}", description=description)
