"""Markdown on the console with autoplan's tables: rich renders Markdown tables with columns that
end a long cell in "…"; here each table is a :class:`autoplan.display.FitTable`, so a number or
a flag (``--allow-lossy``) is never cut, at any width (the table turns or lists itself instead).
A column whose every cell reads as a number (``12.3``, ``+4.5%``, ``1.36x``, ``$21.38``) stays
unbroken; the others wrap at spaces."""

from __future__ import annotations

import re

from rich.markdown import Markdown, TableElement

from autoplan.display import FitTable

NUMBER = re.compile(r"^[+\-−]?\$?[0-9][0-9.,]*(%|x| ?[a-zµ]{1,3})?$")


class _FitTableElement(TableElement):
    def __rich_console__(self, console, options):
        headers = [c.content.plain for c in self.header.row.cells] if self.header and self.header.row else []
        rows = [[c.content.plain for c in row.cells] for row in (self.body.rows if self.body else [])]
        numbers = {h for i, h in enumerate(headers) if rows and all(NUMBER.match(r[i].strip()) for r in rows)}
        table = FitTable(headers=headers, numbers=numbers)
        for row in rows:
            table.add_row(*row)
        yield table


class FitMarkdown(Markdown):
    """rich's Markdown, with tables that never cut a cell."""

    elements = {**Markdown.elements, "table_open": _FitTableElement}
