"""What the supervisor keeps of a child's stderr: a small ring of its last lines, and a park detail."""

from __future__ import annotations

import asyncio

import pytest

from piworkflows.supervisor.stderr import StderrTail, exit_text, park_detail

pytestmark = pytest.mark.timeout(60)


def tail_of(*chunks: bytes, lines: int = 3, chars: int = 10) -> list[str]:
    async def read() -> list[str]:
        stream = asyncio.StreamReader()
        tail = StderrTail(stream, lines, chars)
        for chunk in chunks:
            stream.feed_data(chunk)
        stream.feed_eof()
        await tail.drained(30)
        return tail.take()

    return asyncio.run(read())


def test_only_the_last_lines_are_kept_each_cut_to_its_bound():
    assert tail_of(b"one\ntwo\nthree\nfour\n") == ["two", "three", "four"]
    assert tail_of(b"a very long line indeed\nshort\n") == ["a very lon", "short"]
    assert tail_of(b"a line that goes ", b"on over many chunks ", b"without end") == ["a line tha"]


def test_a_line_split_across_chunks_and_utf8_stay_whole():
    assert tail_of(b"tr", b"ace\nb\xc3", b"\xa4r\n") == ["trace", "b\u00e4r"]


def test_blank_lines_are_dropped_and_unprintable_characters_replaced():
    assert tail_of(b"\n  \nred \x1b[31mtext\r\n\n") == ["red ?[31mt"]
    assert tail_of(b"bad \xff byte\n", chars=20) == ["bad \ufffd byte"]


def test_take_empties_the_ring():
    async def read() -> tuple[list[str], list[str]]:
        stream = asyncio.StreamReader()
        tail = StderrTail(stream, 5, 50)
        stream.feed_data(b"first run\n")
        stream.feed_eof()
        await tail.drained(30)
        return tail.take(), tail.take()

    assert asyncio.run(read()) == (["first run"], [])


def test_the_park_detail_is_the_last_line_or_how_the_runner_ended():
    assert park_detail(["Traceback (most recent call last):", "  File x", "ValueError: x"], 1) == "ValueError: x"
    assert park_detail([], 3) == "the runner exited with code 3"
    assert park_detail([], -9) == "the runner was killed by SIGKILL"
    assert park_detail([], None) is None
    assert exit_text("resolver", -200) == "the resolver was killed by signal 200"
