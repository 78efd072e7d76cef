"""The CSV writer built from parts of rows (types/tables.py, joined_text) writes what the csv module
writes for the whole rows, byte for byte, whatever the cells: shared parts, text to quote, numbers
whose ``str`` and ``repr`` differ, None, and objects the csv module writes by their ``repr``."""

from __future__ import annotations

import csv
import enum
import io
import math

import numpy as np

from autoplan.types.tables import Column, csv_text, joined_text

HEADER = ["a", "b", "c", "d", "e"]


class Mode(str, enum.Enum):  # a str subclass whose str() is not its text
    FAST = "fast"


def _rows(parts: list[list[tuple]]) -> list[list]:
    tuples = [[(cell,) for cell in part] if isinstance(part, Column) else part for part in parts]
    return [[cell for part in tuples for cell in part[i]] for i in range(len(parts[0]))]


def _same_as_csv(parts: list[list[tuple]]) -> str:
    text = joined_text(HEADER, parts)
    assert text == csv_text(HEADER, _rows(parts))
    return text


def test_plain_numbers_and_words_are_written_as_csv_writes_them():
    numbers = [(i, i / 7, -0.0 if i % 2 else 0.0) for i in range(40)] + [(True, math.inf, math.nan)]
    words = [("pruned", False)] * 40 + [("*", 1)]  # one tuple shared by most rows
    _same_as_csv([numbers, [(f"w{i}", i % 2 == 0) for i in range(41)]])  # and each its own
    text = _same_as_csv([numbers, words])
    assert list(csv.reader(io.StringIO(text)))[2][:3] == ["1", repr(1 / 7), "-0.0"]


def test_text_that_needs_quoting_is_quoted_once_per_value():
    reasons = [('pruned: lower bound 2.5 >= 1, "top-1"',), ("line\nbreak",), ("cr\r",), ("",)] * 10 + [("ok",)]
    other = [(1, 2, 3, 4)] * 41
    _same_as_csv([[(i, 'say "x"', "a,b") for i in range(41)], [(i / 3,) for i in range(41)]])
    text = _same_as_csv([other, reasons])
    assert [row[-1] for row in csv.reader(io.StringIO(text))][1:3] == [
        'pruned: lower bound 2.5 >= 1, "top-1"',
        "line\nbreak",
    ]


def test_shared_parts_none_and_other_objects_are_written_as_csv_writes_them():
    shared = ("", "pruned", None)
    heads = [shared] * 30 + [(1, "evaluated", 0.5)]
    odd = [(np.float64(i / 4), Mode.FAST) for i in range(15)] + [(np.int64(i), "a,b") for i in range(16)]
    _same_as_csv([heads, odd])  # numpy scalars by their str, a str subclass by its text (fast, not Mode.FAST)
    _same_as_csv([heads, [(np.float64(i / 4), i) for i in range(31)]])
    _same_as_csv([heads, [(Mode.FAST, f"{i}") for i in range(31)]])
    _same_as_csv([[(None, 1, "x")], [(2.0, "")]])  # too few rows to share: each part on its own
    assert joined_text(HEADER, [[], []]) == csv_text(HEADER, [])


def test_parts_of_unequal_length_are_refused():
    try:
        joined_text(HEADER, [[(1,)], []])
    except ValueError as exc:
        assert "one tuple per row" in str(exc)
    else:
        raise AssertionError("parts of unequal length were written")


def test_a_column_of_cells_is_written_as_csv_writes_them():
    head = [(i, "x") for i in range(8)]
    numbers = Column([0.0, -0.0, 1 / 3, math.inf, math.nan, 7, True, 10**20])  # str, one by one
    words = Column(["pruned", 'say "x"', "a,b", "", "line\nbreak", "pruned", "naïve, ☃", "日本"])  # once per value
    mixed = Column([1, "", 2.5, "*", True, "ünï", 3, ""])  # no string to quote: each by str
    odd = Column([None, np.float64(0.25), Mode.FAST, 0.25, 1, "a,b", np.int64(3), False])  # the csv module
    for column in (numbers, words, mixed, odd, Column([*mixed[:7], 'a,"b"'])):
        _same_as_csv([head, column])
        _same_as_csv([column, head, column])
    text = _same_as_csv([head, odd])
    cells = [row[2] for row in csv.reader(io.StringIO(text))]
    assert (cells[1], cells[3]) == ("", "fast")  # None blank, a str subclass by its text
