"""Text from the data shown safely on a terminal: ids and messages may hold anything.

``shown(text)`` escapes what a terminal would act on instead of print: control characters (ESC
sequences, bell, newlines), and invisible format characters such as right-to-left overrides and
marks (``\\u202e``, ``\\u200f``), as Python escapes (``\\x1b``, ``\\u202e``). ``markup(text)`` also escapes
rich markup (``[bold]``), for a value placed inside a string that rich parses; ``cell(text)`` is a
table cell that rich never parses. The files the commands write keep the values unchanged.
"""
from __future__ import annotations

import unicodedata

from rich.markup import escape
from rich.text import Text

#: Unicode categories a terminal acts on or does not show: control, format (bidi), separators,
#: surrogates, private use, unassigned.
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def _escaped(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else (f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


def shown(text: object) -> str:
    """``text`` with every control or invisible format character written as its escape."""
    s = str(text)
    return "".join(_escaped(c) if unicodedata.category(c) in _HIDDEN else c for c in s)


def markup(text: object) -> str:
    """``shown(text)`` with rich markup escaped too, for use inside a string rich parses."""
    return escape(shown(text))


def cell(text: object) -> Text:
    """A table cell (or title) showing ``shown(text)`` literally."""
    return Text(shown(text))
