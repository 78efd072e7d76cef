"""The per-op and per-stage CSV files of autoplan's folders: one row type each, whose fields are the
file's columns in order (docs/plan-format.md, docs/trace.md), one writer and one reader.

Two files are named ``ops.csv`` and hold different rows; the names are part of the folder formats:

- ``autoplan trace --out DIR``: :class:`TracedOp`, one traced graph node as traced, unpriced;
  its ``name`` is the node and its ``op`` the node's kind;
- ``autoplan plan --out DIR``: :class:`PricedOp`, one traced graph node priced under the best plan
  on one device; its ``op`` is the node (``name`` above) and its ``kind`` the node's kind (``op`` above).
  ``autoplan report`` copies it with one more column, ``share_of_compute``.

``stages.csv`` (``autoplan plan``): :class:`StageRow`, one pipeline stage of the best plan.

:func:`joined_text` writes what :func:`csv_text` writes, byte for byte, from parts of rows rendered
apart: the planner's plans.csv (a row per candidate, 220K on GPT-3 175B; docs/cli.md, "Planning time").
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, fields
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class TracedOp:
    """One row of the trace's ops.csv: a graph node's sizes and FLOPs for the whole global batch."""

    name: str  # the node
    op: str  # its kind (types/graph.py OP_KINDS)
    module: str
    layer: str  # the block it belongs to; '' outside every block
    params: int
    param_bytes: int
    output_bytes: int
    saved_bytes: int
    fwd_flops: int
    bwd_flops: int


@dataclass(frozen=True)
class PricedOp:
    """One row of the plan's ops.csv: a graph node under the best plan, per micro-batch on one device."""

    op: str  # the node (TracedOp.name)
    kind: str  # its kind (TracedOp.op)
    module: str
    layer: str  # '' outside every block
    stage: int
    split: str  # its tp split; '-' for a node that has none
    compute_shard: int
    compute_s: float  # forward + backward
    comm_s: float  # the TP comm terms attributed to it
    param_state_bytes: int  # weights + grads + optimizer state after TP and ZeRO
    activation_bytes: int  # saved for the backward


@dataclass(frozen=True)
class StageRow:
    """One row of stages.csv: a pipeline stage of the best plan, per micro-batch on one device."""

    stage: int
    blocks: int
    first_block: str
    last_block: str
    micro_batch_time_s: float  # forward + backward + recomputation + TP, outside modules included
    memory_bytes: int  # the stage's priced peak
    send_bytes: int
    recv_bytes: int
    send_recv_s: float
    forward_s: float  # the forward part of micro_batch_time_s


def columns(row_type: type) -> tuple[str, ...]:
    """A CSV file's columns: its row type's fields, in order."""
    return tuple(f.name for f in fields(row_type))


def csv_text(header: list[str] | tuple[str, ...], rows: list[list[Any]] | list[tuple]) -> str:
    """CSV text: the header, then one line per row, values as ``str`` gives them ('' for None)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


class Column(list):
    """A part of :func:`joined_text` that is one cell a row, given as the cells themselves (not 1-tuples)."""


def joined_text(
    header: list[str] | tuple[str, ...], parts: list[list[tuple] | Column], *, order: list[int] | None = None
) -> str:
    """:func:`csv_text` of the rows whose row i is ``parts[0][i] + parts[1][i] + ...``, byte for byte,
    in ``order`` (row indexes; default as they come), without building those rows: each part becomes
    text on its own (:func:`_part_texts`, or :func:`_column_texts` for a :class:`Column`: ``(cell,)``
    a row), and a row's texts are joined by commas. For a table of many rows: plans.csv (220K rows on
    GPT-3 175B)."""
    if len({len(part) for part in parts}) > 1:
        raise ValueError(f"parts of {sorted({len(part) for part in parts})} rows; every part needs one tuple per row")
    lines = list(map(",".join, zip(*(_column_texts(p) if isinstance(p, Column) else _part_texts(p) for p in parts))))
    if order is not None:
        lines = list(map(lines.__getitem__, order))
    return csv_text(header, []) + "\n".join(lines) + ("\n" if lines else "")


#: Cells that ``%s`` writes as the csv module does: numbers by ``str`` (a float's is its ``repr``) and strings
_PLAIN = frozenset({int, float, bool, str})


def _part_texts(part: list[tuple]) -> list[str]:
    """Each tuple of cells in ``part`` as the csv module writes it inside a longer row: a tuple that
    many rows share (the same object) once, tuples of strings once per distinct value, tuples of
    plain cells (:data:`_PLAIN`, no string to quote) by one ``%`` format each, others by the csv module."""
    shared = {id(cells): cells for cells in part}
    if len(shared) * 2 <= len(part):
        texts = {key: _cells_text(cells) for key, cells in shared.items()}
        return [texts[id(cells)] for cells in part]
    kinds = set(map(type, chain.from_iterable(part)))
    widths = set(map(len, part))
    if kinds == {str}:
        distinct = {cells: _cells_text(cells) for cells in set(part)}
        return list(map(distinct.__getitem__, part))
    strings = (value for value in set(chain.from_iterable(part)) if type(value) is str)
    if kinds <= _PLAIN and len(widths) == 1 and all(_cells_text((text,)) == text for text in strings):
        line = ",".join(["%s"] * widths.pop())
        return [line % cells for cells in part]
    return list(map(_cells_text, part))


def _column_texts(cells: Column) -> list[str]:
    """:func:`_part_texts` of the part ``[(cell,) for cell in cells]``, without its tuples: numbers,
    booleans and strings that need no quotes by ``str`` (what the csv module writes for their exact types:
    a float by its ``repr``, which is its ``str``), other strings once per distinct value, and columns with
    other cells (None, subclasses) by the csv module."""
    kinds = set(map(type, cells))
    if kinds <= _NUMBERS:
        return list(map(str, cells))
    if kinds <= _PLAIN:
        strings = [cell for cell in set(cells) if type(cell) is str]
        texts = _strings_texts(strings)
        if texts == strings:  # no string to quote
            return list(map(str, cells))
        if kinds == {str}:
            return list(map(dict(zip(strings, texts)).__getitem__, cells))
    return [_cells_text((cell,)) for cell in cells]


def _strings_texts(strings: list[str]) -> list[str]:
    """Each of ``strings`` as :func:`_cells_text` writes it alone, by one csv writer: each is a row
    ``[text, '']``, read back from where it starts to its ``,\n``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    ends = []
    for text in strings:
        writer.writerow((text, ""))
        ends.append(buffer.tell())
    written = buffer.getvalue()
    return [written[start : end - 2] for start, end in zip([0, *ends], ends)]


#: Cells that ``str`` writes as the csv module does, whatever their value
_NUMBERS = frozenset({int, float, bool})


def _cells_text(cells: tuple) -> str:
    """``cells`` as the csv module writes them inside a longer row (a lone '' row is written '""')."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([*cells, ""])
    return buffer.getvalue()[:-2]


def table_text(rows: list[Any], row_type: type) -> str:
    """The CSV text of ``rows`` (all of ``row_type``) under ``row_type``'s header: each row's cells by one
    ``attrgetter`` call (9,598 rows of DeepSeek-V3's ops.csv by a list comprehension of getattr took 30 ms)."""
    names = columns(row_type)
    cells = attrgetter(*names) if len(names) > 1 else lambda row: (getattr(row, names[0]),)
    return csv_text(names, list(map(cells, rows)))


def read_table(path: Path, *, error: type[Exception], rerun: str) -> pd.DataFrame | None:
    """A CSV file of an autoplan folder as a DataFrame; None when it is absent; ``error`` naming the
    command to ``rerun`` when it cannot be parsed."""
    import pandas as pd

    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise error(f"'{path}' is not a readable CSV ({exc}); re-run `{rerun}`.") from None
