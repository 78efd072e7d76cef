"""Values memoised per tp_plan, safely: thousands of candidate plans share the ILP's one dict.

Keying on the dict's identity is what makes the memo cheap, but an id is reused once a dict is
freed, and a caller may edit a tp_plan in place. Each entry therefore keeps a copy of the dict
it was made from and is remade when the dict now differs: a stale entry is never returned. A
:class:`~autoplan.types.frozen_tp_plan.FrozenTpPlan` (what the search's ILP hands out) cannot be
edited, so its entry holds the object itself and a hit is an identity check.
"""

from __future__ import annotations

from typing import Any, Callable

from autoplan.types.frozen_tp_plan import FrozenTpPlan


class TpPlanMemo:
    """``get(key, tp_plan, make)``: ``make()``, memoised on ``key`` and ``tp_plan`` (module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, dict[str, str]]] = {}

    def get(self, key: tuple, tp_plan: dict[str, str], make: Callable[[], Any]) -> Any:
        full = (id(tp_plan), *key)
        hit = self._entries.get(full)
        if hit is not None and (hit[1] is tp_plan or (type(hit[1]) is dict and hit[1] == tp_plan)):
            return hit[0]
        kept = tp_plan if type(tp_plan) is FrozenTpPlan else dict(tp_plan)  # held: its id stays its own
        self._entries[full] = (value := make(), kept)
        return value
