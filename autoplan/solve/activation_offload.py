"""Which plans the search prices with their activations offloaded (``Plan.offload_activations``;
docs/cost-model.md, "Activation offload"): only where the executor runs it (autoplan/types/activation_offload.py:
tp = cp = ep = 1, not compiled, runtime autoplan, some block without recompute) and the profile describes a host,
and only where it is needed: a plan that does not fit is priced again with its activations offloaded. The
copies only add step time (cost/memory/activation_offload.py), so a plan that fits never gains from them; the
search then weighs the offloaded plan against the plans that recompute. ``--fix offload_activations=true``
offloads every plan that can (the others are skipped), ``=false`` none.
"""

from __future__ import annotations

from dataclasses import fields, replace

from autoplan.cost import usable_bytes
from autoplan.errors import PlanError
from autoplan.types.activation_offload import check_activation_offload, offload_refusal
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


def check_activation_offload_pin(profile: Profile, fixes: dict, runtime: str) -> None:
    """A pinned activation offload the profile, the runtime or another pin rules out: one sentence."""
    if not fixes.get("offload_activations"):
        return
    if profile.host is None:
        raise PlanError(
            f"--fix offload_activations=true but profile '{profile.name}' has no host section (host memory and link, "
            "docs/profile-format.md); add one, or run `autoplan profile` on the host, or drop the pin."
        )
    clashes = [f"{key}={fixes[key]}" for key in ("tp", "cp", "ep") if fixes.get(key, 1) > 1]
    clashes += ["compile=on"] if fixes.get("compile") else []
    clashes += [f"runtime {runtime}"] if runtime != "autoplan" else []
    if fixes.get("recompute", "none") != "none" and "recompute_blocks" not in fixes:
        clashes.append(f"recompute={fixes['recompute']} on every block")
    if clashes:
        raise PlanError(
            f"--fix offload_activations=true with {', '.join(clashes)}: activations are offloaded at tp = cp = ep = 1, "
            "uncompiled, by autoplan's executor, from blocks that do not recompute; drop one pin."
        )


def _offloaded(plan: Plan) -> Plan | None:
    """``plan`` with its activations offloaded, or None where the executor cannot run that: at once where the offload
    rule refuses it (types/activation_offload.py ``offload_refusal``, which the checked copy's checks would raise on),
    else where the copy's checks raise."""
    if offload_refusal(plan) is not None:
        return None
    try:
        offloaded = replace(plan, offload_activations=True)
    except PlanError:
        return None
    return offloaded


def may_offload(plan: Plan, profile: Profile, fixes: dict) -> bool:
    """Whether the search may price ``plan`` with its activations on the host: pinned so, or the retry of a plan
    that does not fit (:func:`offloaded_retry`), which the memory floor must not rule out
    (Bounds.memory_floor_bytes)."""
    if profile.host is None or fixes.get("offload_activations") is False:
        return False
    return plan.offload_activations or _offloaded(plan) is not None


def may_offload_a_twin(plan: Plan, profile: Profile, fixes: dict) -> bool:
    """Whether the search may price ``plan`` or a twin of it with fewer blocks recomputed (solve/recompute_budget.py)
    with its activations on the host: :func:`may_offload` as if it recomputed nothing, asking the offload rule
    alone (types/activation_offload.py), which the plan's other choices do not touch."""
    if profile.host is None or fixes.get("offload_activations") is False:
        return False
    values = {f.name: getattr(plan, f.name) for f in fields(plan)}
    values.update(recompute="none", recompute_blocks=[], offload_activations=True)
    try:
        check_activation_offload(Plan.unchecked(**values))
    except PlanError:
        return False
    return True


def with_pin(plan: Plan | None, fixes: dict) -> Plan | None:
    """The plan the search prices under the pin: offloaded when pinned true (None when it cannot be)."""
    if plan is None or not fixes.get("offload_activations") or plan.offload_activations:
        return plan
    return _offloaded(plan)


def offloaded_retry(plan: Plan, *, cost: Cost, profile: Profile, fixes: dict) -> Plan | None:
    """The same plan with its activations offloaded, when it did not fit, could run so and is not pinned off, and
    could fit: offload frees at most the activations, so a plan whose peak less them exceeds the usable memory
    is not priced again (the states alone, or a host too small, rule it out)."""
    if cost.feasible or plan.offload_activations or profile.host is None or fixes.get("offload_activations") is False:
        return None
    if cost.peak_memory_bytes - cost.activations_bytes > usable_bytes(profile.device.memory_bytes):
        return None
    return _offloaded(plan)
