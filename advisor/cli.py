"""The `tame` command: one sub-command per module in advisor/commands/."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from advisor.terminal import visible_output

# Each name is a module advisor.commands.<name> with register(subparsers) that adds its parser
# and sets `handler` (args -> exit code) as a default.
COMMANDS = ("fit", "curve", "probe", "advise", "serve", "agent", "paths", "testbed", "cc", "transfer", "schedule")


# The most of one message the CLI prints. A value a message quotes may be as long as the environment or argv allow
# (100 KB and more, printed three times over as repr escapes); its start, which names what is wrong, and its end,
# which says what to do, are kept.
MAX_MESSAGE_CHARS = 1000


def clipped(message: str) -> str:
    """``message`` cut to MAX_MESSAGE_CHARS or a little more, its middle left out."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    half = MAX_MESSAGE_CHARS // 2
    return f"{message[:half]}…[{len(message) - 2 * half} characters left out]…{message[-half:]}"


class UsageError(Exception):
    """Bad command-line input; the message says what to fix."""


class _Parser(argparse.ArgumentParser):
    """Reports bad arguments in one line that names the command and what to fix."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {clipped(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tame", description="Parallel TCP stream advice (TameParallelTCP).")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"advisor.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Whatever a command prints (text from the store or a server among it) goes out with its control and bidi
    # characters as visible escapes (advisor/terminal.py).
    with visible_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"tame {args.command}: {clipped(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"tame {args.command}: interrupted", file=sys.stderr)
        return 130

