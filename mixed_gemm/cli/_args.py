"""The subcommands' argument rules. Each numeric or list argument has a type here that checks its
value while the command line is parsed, before any GPU is looked for or any work starts; a bad value
ends the command with exit code 2 and one line, ``mixed-gemm <command>: error: --flag: <rule>, got
<value>`` (:class:`CommandParser`), never a traceback."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterable, List


class BadArguments(SystemExit):
    """A subcommand's arguments broke a rule (the line is printed already); exit code 2."""

    def __init__(self) -> None:
        super().__init__(2)


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument error is one line naming the flag (no usage block)."""

    def error(self, message: str):
        if message.startswith("argument "):
            message = message[len("argument "):]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise BadArguments()


def fail(command: str, message: str) -> int:
    """A rule checked in a command's handler (one that spans arguments): the same one line; 2."""
    print(f"mixed-gemm {command}: error: {message}", file=sys.stderr)
    return 2


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_ints(text: str) -> List[int]:
    """Comma-separated positive integers, at least one (``--ms``, ``--tokens``, ``--batches``)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def group_size(text: str) -> int:
    """-1 (one group per row) or a power of two >= 32, what the kernels take (``prepack``'s rule)."""
    value = _int(text)
    if value != -1 and (value < 32 or value & (value - 1)):
        raise argparse.ArgumentTypeError(f"expected -1 (per channel) or a power of two >= 32, got {text!r}")
    return value


def presets(names: Callable[[], Iterable[str]], many: bool = True, noun: str = "preset") -> Callable[[str], str]:
    """A type for ``--model``: one preset (``many=False``) or comma-separated presets of ``names()``
    (called at parse time, so its module loads only for that command); the text is kept as given.
    ``noun`` names what they are (``--families``: "family")."""

    def check(text: str) -> str:
        known = list(names())
        given = [m for m in text.split(",") if m] if many else [text]
        bad = [m for m in given if m not in known]
        if bad or (not many and not text):
            plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
            what = f"comma-separated {plural} from" if many else f"one {noun} of"
            raise argparse.ArgumentTypeError(f"expected {what} {', '.join(known)}, got {text!r}")
        return text

    return check


def shapes(text: str) -> str:
    """Comma-separated ``N:K`` pairs of positive integers (kept as given)."""
    from ..profiler.problems import parse_shapes

    if text:
        try:
            parse_shapes(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--shapes: ")) from None
    return text
