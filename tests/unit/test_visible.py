"""Text from a run as a terminal shows it (cli/base.py ``visible``): no control reaches it raw."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piworkflows.cli import story
from piworkflows.cli.base import visible, visible_lines

pytestmark = pytest.mark.timeout(60)

any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()))
BIDI = {"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("title\x1b]0;pwned\x07", "title\\e]0;pwned\\x07"),
        ("a\r\nb", "a\\r\\nb"),
        ("\x9b2J", "\\x9b2J"),
        ("\u202eevil", "\\u202eevil"),
        ("tab\tstays", "tab\tstays"),
        ("lone\ud800", "lone\ufffd"),
        ("plain é 😀", "plain é 😀"),
    ],
)
def test_controls_show_as_escapes(text, shown):
    assert visible(text) == shown


def test_a_cut_comes_after_the_escape_never_between_esc_and_its_bracket():
    assert story.cut("\x1b[31mred", 4) == "\\..."
    assert "\x1b" not in story.cut("abc\x1b[31m", 5)


@given(any_text)
def test_property_no_control_and_no_lone_surrogate_survives(text):
    shown = visible(text)
    for char in shown:
        assert char == "\t" or unicodedata.category(char) not in ("Cc", "Cs"), repr(char)
        assert char not in BIDI
    assert visible(shown) == shown  # once is enough: the escapes are plain text
    assert all("\n" not in line for line in visible_lines(text))
