"""A tp_plan that cannot change once the search has made it, so memos may key on its identity.

The search hands one tp_plan dict from the ILP to thousands of candidate plans, and the cost model's
memos (cost/tp/plan_memo.py) key on the dict's identity. For a plain dict that key needs a guard: the
id of a freed dict is reused and a caller may edit a dict in place, so each hit compares the stored
copy with the dict (4 of 4.2 µs per hit on a 387-module plan). A :class:`FrozenTpPlan` refuses every
edit, and the memo holds the object itself (so its id is not reused while the entry lives): a hit is
an identity check. It is still a dict: plans, JSON and the executor read it unchanged.
"""

from __future__ import annotations

import functools


class FrozenTpPlan(dict):
    """A dict of module FQN -> split that raises on every edit (module docstring)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a FrozenTpPlan cannot change: make a new dict (dict(tp_plan)) to edit a tp_plan")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    @functools.cached_property
    def splits(self) -> frozenset[str]:
        """The splits it names, each once: Plan's check reads them for every plan the search prices."""
        return frozenset(self.values())

    def __reduce__(self):
        return (FrozenTpPlan, (dict(self),))

    def __copy__(self) -> FrozenTpPlan:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenTpPlan:
        return self
