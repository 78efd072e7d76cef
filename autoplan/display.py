"""How autoplan prints what it priced: one name per step-time term, numbers in sensible units,
and console tables that never cut a number off.

**Terms.** ``TERM_NAMES`` maps every ``Cost.TIME_FIELDS`` name to the column header and the
words docs/cost-model.md uses for it ("Step time"); the console tables, the explanation and the
report's figures all take their names from here, so no internal field name reaches a reader.

**Numbers.** :func:`number_text` keeps at least three significant figures and never an
exponent (``1182``, ``12.3``, ``0.0402``); :func:`duration_text` picks s, ms, µs or ns so that
the number reads 1 to 999 (``40.2 ns`` rather than ``4.017e-05 ms``).

**Tables.** A :class:`FitTable` is a rich renderable that chooses its layout from the width it is
given (a terminal's, or the one a piped console is built with):

1. one row per record, as written, when every number fits whole and every text column fits its
   longest word; the text columns share what is left and wrap at spaces;
2. else turned on its side: one column per record, one row per header (a 5-plan table with 15
   columns needs about 60 columns this way);
3. else one block of ``header: value`` lines per record, which wraps like prose.

Column widths are computed here and handed to rich as fixed widths, so rich never shrinks a
column below a number's length (rich's own last resort shortens every column and ends cells
with "…").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from autoplan.types.cost import Cost

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions


@dataclass(frozen=True)
class TermName:
    header: str  # a table column (short)
    words: str  # a sentence or a legend (docs/cost-model.md "Step time")


TERM_NAMES: dict[str, TermName] = {
    "compute_s": TermName("compute", "compute (forward, backward, recomputation)"),
    "tp_comm_s": TermName("TP comm", "tensor-parallel collectives"),
    "ep_comm_s": TermName("EP a2a", "expert-parallel all-to-all (MoE dispatch and combine)"),
    "cp_comm_s": TermName("CP KV", "context-parallel key/value exchange (exposed)"),
    "dp_comm_exposed_s": TermName("DP sync", "data-parallel gradient sync (exposed)"),
    "compression_s": TermName("compress", "gradient compression (PowerSGD matmuls, error feedback)"),
    "zero_comm_s": TermName("ZeRO-3", "ZeRO-3 parameter gathers (exposed)"),
    "pp_comm_s": TermName("PP send", "pipeline send/recv and tied-weight sync"),
    "bubble_s": TermName("bubble", "pipeline bubble"),
    "grad_accum_s": TermName("grad accum", "gradient accumulation over micro-batches"),
    "optimizer_s": TermName("optimizer", "optimizer step"),
}
assert set(TERM_NAMES) == set(Cost.TIME_FIELDS), "TERM_NAMES must name every Cost time field"

MEMORY_NAMES: dict[str, str] = {
    "weights_bytes": "weights",
    "grads_bytes": "gradients",
    "optimizer_bytes": "optimizer states",
    "activations_bytes": "activations",
    "comm_buffer_bytes": "communication buffers",
}
assert set(MEMORY_NAMES) == set(Cost.MEMORY_FIELDS), "MEMORY_NAMES must name every Cost memory field"


def number_text(value: float) -> str:
    """``value`` with at least three significant figures, no exponent: 1182, 12.3, 0.0402."""
    if value == 0 or not math.isfinite(value):
        return f"{value:.0f}" if math.isfinite(value) else str(value)
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def si_text(value: float, unit: str) -> str:
    """``value`` with the SI prefix that makes it read 1 to 999: ``428 MFLOP``, ``2.04 TB/s``."""
    scale, prefix = next(((s, p) for s, p in SI_PREFIXES if abs(value) >= s), SI_PREFIXES[-1])
    return f"{number_text(value / scale)} {prefix}{unit}"


DURATION_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def duration_unit(seconds: float) -> tuple[float, str]:
    """(seconds per unit, unit) that makes ``seconds`` read 1 to 999 (s at most, ns at least)."""
    size = abs(seconds)
    return next(((s, u) for s, u in DURATION_UNITS if size >= s), DURATION_UNITS[-1])


def duration_text(seconds: float, *, signed: bool = False) -> str:
    """A duration in the unit that makes it read 1 to 999 (s at most): ``40.2 ns``, ``1.36 s``."""
    scale, unit = duration_unit(seconds)
    text = number_text(seconds / scale) + f" {unit}"
    return ("+" + text) if signed and seconds > 0 else text


def trade_text(gain_s: float, *, verb: str) -> str:
    """``verb`` and the seconds an option gains (``pays 3.1 ms``), or ``costs`` and what it loses."""
    return f"{verb} {duration_text(gain_s)}" if gain_s >= 0 else f"costs {duration_text(-gain_s)}"


def hours_text(hours: float) -> str:
    """3.1 days, 14.2 h, 35 min or 12 s."""
    if hours >= 48:
        return f"{hours / 24:.3g} days"
    if hours >= 1:
        return f"{hours:.3g} h"
    if hours >= 1 / 60:
        return f"{hours * 60:.3g} min"
    return f"{hours * 3600:.3g} s"


def usd_text(dollars: float) -> str:
    """$52,300 (three significant figures above $1,000), $12.40 below."""
    if dollars >= 1000:
        digits = max(0, math.floor(math.log10(dollars)) - 2)
        return f"${round(dollars, -digits):,.0f}"
    return f"${dollars:,.2f}"


@dataclass
class FitTable:
    """Rows of strings under headers; ``numbers`` names the columns whose cells must stay whole.
    Printing it with rich picks the widest layout that fits (module docstring)."""

    headers: list[str]
    numbers: set[str]
    title: str = ""
    caption: str = ""
    rows: list[list[str]] = field(default_factory=list)

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"a row of {len(cells)} cells under {len(self.headers)} headers")
        self.rows.append([str(c) for c in cells])

    def layout(self, width: int) -> str:
        """``rows``, ``columns`` (on its side) or ``records``: the layout printed at ``width``."""
        if _widths(self._grid(), width) is not None:
            return "rows"
        return "columns" if _widths(self._turned(), width) is not None else "records"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator:
        width = options.max_width
        for grid in (self._grid(), self._turned()):
            widths = _widths(grid, width)
            if widths is not None:
                yield _rich_table(grid, widths, title=self.title, caption=self.caption)
                return
        yield from self._records()

    def _grid(self) -> _Grid:
        kinds = ["number" if h in self.numbers else "text" for h in self.headers]
        return _Grid(self.headers, [[(c, k) for c, k in zip(row, kinds)] for row in self.rows])

    def _turned(self) -> _Grid:
        """One column per record, headed by its first cell; one row per remaining header."""
        headers = [self.headers[0], *(row[0] for row in self.rows)]
        kind = ["number" if h in self.numbers else "text" for h in self.headers]
        rows = [
            [(name, "text"), *((row[i], kind[i]) for row in self.rows)] for i, name in enumerate(self.headers) if i > 0
        ]
        return _Grid(headers, rows)

    def _records(self) -> Iterator:
        from rich.text import Text

        if self.title:
            yield Text(self.title, style="italic")
        for row in self.rows:
            yield Text("\n".join(f"{h}: {c}" for h, c in zip(self.headers, row)) + "\n")
        if self.caption:
            yield Text(self.caption, style="dim")


@dataclass
class _Grid:
    headers: list[str]
    cells: list[list[tuple[str, str]]]  # (text, "number" | "text")


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def _widths(grid: _Grid, width: int) -> list[int] | None:
    """Each column's width (padding and borders aside) so that numbers stay whole and text wraps
    only at spaces; None when that needs more than ``width``. Text columns share what is left
    (:func:`_share`)."""
    columns = [[(h, "text"), *(row[i] for row in grid.cells)] for i, h in enumerate(grid.headers)]
    low = [max(len(t) if k == "number" else _longest_word(t) for t, k in col) for col in columns]
    high = [max(len(t) for t, _ in col) for col in columns]
    free = width - (3 * len(columns) + 1) - sum(low)  # a box border and a space each side of every column
    if free < 0:
        return None
    return _share(low, high, free)


def _share(low: list[int], high: list[int], free: int) -> list[int]:
    """Max-min fair shares of ``free`` columns: the column that wants least is served first, each
    getting at most an equal share of what is left (so a short column is never squeezed by a long one)."""
    widths = list(low)
    order = sorted(range(len(low)), key=lambda i: high[i] - low[i])
    for served, i in enumerate(order):
        give = min(high[i] - low[i], free // (len(order) - served))
        widths[i] += give
        free -= give
    return widths


def _rich_table(grid: _Grid, widths: list[int], *, title: str, caption: str):
    from rich.table import Table
    from rich.text import Text  # cells are plain text: "[1, 2]" is not rich markup

    table = Table(title=Text(title) if title else None, caption=Text(caption) if caption else None)
    numeric = [all(k == "number" for _, k in (row[i] for row in grid.cells)) for i in range(len(grid.headers))]
    for header, width, is_number in zip(grid.headers, widths, numeric):
        table.add_column(Text(header), width=width, justify="right" if is_number else "left", overflow="fold")
    for row in grid.cells:
        table.add_row(*(Text(text) for text, _ in row))
    return table
