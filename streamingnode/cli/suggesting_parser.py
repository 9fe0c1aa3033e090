"""The parser class of every ``streamingnode`` command: argparse's, plus "did you mean" for a mistyped
command, choice or flag.

argparse (before 3.14) answers ``streamingnode grops list`` with the whole list of commands and
``--chanel`` with "unrecognized arguments"; this class adds the closest known word (difflib) to both.
The top-level parser is built with it and every sub-parser inherits it (``add_subparsers`` makes
its parsers of the parent's class), so a command added later gets it without doing anything.

Standard library only (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn


def closest(word: str, known: Iterable[str]) -> list[str]:
    """The known words close to ``word``, best first (at most three)."""
    return difflib.get_close_matches(word, list(known), n=3, cutoff=0.6)


def _did_you_mean(candidates: list[str]) -> str:
    return f"; did you mean {' or '.join(candidates)}?" if candidates else ""


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors for an unknown command, choice or flag name the closest known one.

    Unlike argparse's, a parser of this class that has no sub-commands refuses what it does not know
    itself, in ``parse_known_args`` too: the error then comes with its own usage line and flags
    (``streamingnode groups describe: error: unrecognized arguments: --chanel; did you mean --channel?``)
    instead of the top-level parser's.
    """

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            known = [str(c) for c in choices]
            candidates = closest(str(value), known)
            message = (f"invalid choice: {value!r} (choose from {', '.join(map(repr, known))})"
                       + _did_you_mean([repr(c) for c in candidates]))
            raise argparse.ArgumentError(action, message)
        super()._check_value(action, value)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        leaf = self._subparsers is None
        # Found before parsing: a mistyped required flag fails as "required" before "unrecognized".
        self._hints = self._flag_hints(sys.argv[1:] if args is None else list(args)) if leaf else []
        try:
            parsed, extras = super().parse_known_args(args, namespace)
            if extras and leaf:
                self.error(f"unrecognized arguments: {' '.join(extras)}")
        finally:
            self._hints = []
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``message`` with a "did you mean" for each unknown flag, exit 2."""
        super().error(message + "".join(f"; {h}" for h in getattr(self, "_hints", [])))

    def _flag_hints(self, args: list[str]) -> list[str]:
        """"--chanel: did you mean --channel?" for each flag of ``args`` that this parser does not know."""
        known = self._option_string_actions
        flags = [s for s in known if s.startswith("--") and s not in ("--help", "--version")]
        hints = []
        for arg in args:
            if arg == "--":
                break
            if not arg.startswith("--"):
                continue
            name = arg.split("=", 1)[0]
            if name in known or any(f.startswith(name) for f in flags):  # known, or an abbreviation of one
                continue
            candidates = closest(name, flags)
            if candidates:
                hints.append(f"{name}: did you mean {' or '.join(candidates)}?")
        return hints


__all__ = ["SuggestingParser", "closest"]
