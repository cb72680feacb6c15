"""Text that may reach a terminal: every character a terminal acts on rather than shows, as a visible escape.

The characters escaped are those Python does not count printable (``str.isprintable``): C0 and C1 controls (ESC
begins the sequences that move the cursor, clear the screen or retitle the window; CR rewrites a line), format
characters (the bidi overrides and isolates U+202A-U+202E and U+2066-U+2069 that reorder a line, zero-width and tag
characters that hide text), line and paragraph separators, surrogates, private-use and unassigned code points. Each
is written as Python writes it in a string's repr (``\\n``, ``\\x1b``, ``\\u202e``, ``\\U000e0001``), so the text stays
legible and nothing in it drives the terminal. A backslash is left as it is: the escapes are for reading, not for
decoding back.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator, TextIO


def visible(text: str) -> str:
    """``text`` on one line, each character that is not printable (a newline among them) as its escape."""
    if text.isprintable():  # at C speed: the text almost every caller has
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def visible_lines(text: str) -> str:
    """``text`` with its newlines kept, every other character that is not printable as its escape."""
    return "\n".join(visible(line) for line in text.split("\n"))


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class VisibleWriter:
    """A text stream that writes through to ``stream`` what it is given with visible_lines."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(visible_lines(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...: the stream's
        return getattr(self.stream, name)


@contextmanager
def visible_output() -> Iterator[None]:
    """While inside, whatever is written to sys.stdout and sys.stderr goes through VisibleWriter: text a command
    prints from a store or a server (a probe's error, a refusal's detail), whoever wrote it, cannot drive the
    terminal. The streams of before are back after."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if stream is None else VisibleWriter(stream) for stream in before)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before
