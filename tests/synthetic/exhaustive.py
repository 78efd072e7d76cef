"""A search made exhaustive: it prices every candidate (no bound prunes one), whatever its memory floor, and the time
of every plan that does not fit. The exactness and floor tests hold a pruned search, and each bound, to it."""

from __future__ import annotations

from autoplan.solve.search import Search


def priced_everything(search: Search) -> Search:
    """``search``, pricing everything (module docstring)."""
    search._beaten = lambda bound: False  # price every candidate
    search._usable_bytes = float("inf")  # whatever its memory floor
    search.memory_first = False  # and the time of every plan that does not fit
    return search
