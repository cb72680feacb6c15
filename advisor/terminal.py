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


def visible(text: str) -> str:
    """``text`` on one line, each character that is not printable (a newline among them) as its escape."""
    if text.isprintable():  # at C speed: the text almost every caller has
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
