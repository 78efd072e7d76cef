"""Values memoised per tp_plan, safely: thousands of candidate plans share the ILP's one dict.

Keying on the dict's identity is what makes the memo cheap, but an id is reused once a dict is
freed, and a caller may edit a tp_plan in place. Each entry therefore keeps a copy of the dict
it was made from and is remade when the dict now differs: a stale entry is never returned.
"""

from __future__ import annotations

from typing import Any, Callable


class TpPlanMemo:
    """``get(key, tp_plan, make)``: ``make()``, memoised on ``key`` and ``tp_plan`` (module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, dict[str, str]]] = {}

    def get(self, key: tuple, tp_plan: dict[str, str], make: Callable[[], Any]) -> Any:
        full = (id(tp_plan), *key)
        hit = self._entries.get(full)
        if hit is None or hit[1] != tp_plan:
            hit = self._entries[full] = (make(), dict(tp_plan))
        return hit[0]
