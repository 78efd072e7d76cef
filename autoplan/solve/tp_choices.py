"""A search group's tp_plans (solve/best_first.py opens a group with them): one intra-op ILP per ZeRO stage.

The step term of the ILP (cost/dp/param_step.py) prices each split's parameters by the ZeRO stage of the plans it
splits for, so a group whose members differ in their ZeRO stage asks :meth:`Search._choose` once per stage, and
members whose stages choose the same splits share one tp_plan. A tp_plan that splits no op at tp > 1 repeats every
rank's work: its members get one pruned row (solve/search.py ``_degenerate``).
"""

from __future__ import annotations

from typing import Any

from autoplan.solve.candidates import Group


def choices(search: Any, group: Group) -> list[tuple[Any, list]]:
    """The group's tp_plans (solve/tp_plan.py TPChoice), each with the (zero, grads) choices it serves, in their
    order (module docstring)."""
    dp_choices = search._dp_choices(group.degrees)
    plans: list[tuple[Any, list]] = []  # (choice, the ZeRO stages it serves)
    for zero in dict.fromkeys(zero for zero, _ in dp_choices):
        choice = search._choose(group, zero=zero)
        same = next((entry for entry in plans if entry[0].tp_plan == choice.tp_plan), None)
        same[1].append(zero) if same else plans.append((choice, [zero]))
    return [(choice, [c for c in dp_choices if c[0] in served]) for choice, served in plans]


def kept(search: Any, group: Group, bound: float) -> list[tuple[Any, list]]:
    """:func:`choices` that split some op; a pruned row for the members of each other one (one for the whole group
    where none does)."""
    found = choices(search, group)
    reason = f"pruned: tp={group.degrees.tp} splits no op (the ILP replicates every layer), so its ranks would repeat "
    out = [(choice, dp) for choice, dp in found if not search._degenerate(group, choice)]
    for choice, dp in found if out else []:
        if search._degenerate(group, choice):  # the members whose ZeRO stages it serves
            count = len(search._stage_options(group)) * len(dp)
            search._prune_group(group, bound, "degenerate tp", reason=reason + "the same work", count=count)
    if not out:
        search._prune_group(group, bound, "degenerate tp", reason=reason + "the same work")
    return out
