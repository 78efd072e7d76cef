"""The per-op and per-stage CSV files of autoplan's folders: one row type each, whose fields are the
file's columns in order (docs/plan-format.md, docs/trace.md), one writer and one reader.

Two files are named ``ops.csv`` and hold different rows; the names are part of the folder formats:

- ``autoplan trace --out DIR``: :class:`TracedOp`, one traced graph node as traced, unpriced;
  its ``name`` is the node and its ``op`` the node's kind;
- ``autoplan plan --out DIR``: :class:`PricedOp`, one traced graph node priced under the best plan
  on one device; its ``op`` is the node (``name`` above) and its ``kind`` the node's kind (``op`` above).
  ``autoplan report`` copies it with one more column, ``share_of_compute``.

``stages.csv`` (``autoplan plan``): :class:`StageRow`, one pipeline stage of the best plan.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, fields
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


def csv_text(header: list[str] | tuple[str, ...], rows: list[list[Any]]) -> str:
    """CSV text: the header, then one line per row, values as ``str`` gives them ('' for None)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def table_text(rows: list[Any], row_type: type) -> str:
    """The CSV text of ``rows`` (all of ``row_type``) under ``row_type``'s header."""
    names = columns(row_type)
    return csv_text(names, [[getattr(row, name) for name in names] for row in rows])


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
