"""The `tame` command: one sub-command per module in advisor/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each name is a module advisor.commands.<name> with register(subparsers) that adds its parser
# and sets `handler` (args -> exit code) as a default.
COMMANDS = ("fit", "curve", "probe")


class UsageError(Exception):
    """Bad command-line input; the message says what to fix."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tame", description="Parallel TCP stream advice (TameParallelTCP).")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"advisor.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"tame {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tame {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
