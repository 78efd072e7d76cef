"""Which offloads the search offers one (degrees, ZeRO stage, gradient sync) (docs/ilp.md, section 4;
docs/cost-model.md, "Offload"): only where the executor runs them (autoplan/types/offload.py) and the
profile describes a host. "optimizer" beside ZeRO-1 without the weights' all-gather under the next
forward, "full" beside ZeRO-3 at pp = 1, both over dp x cp > 1 ranks without experts; "optimizer" also at ZeRO-0 on
one dp x cp rank (ZeRO-Offload's one-GPU setup, any tp and pp). Offload always costs
step time (cost/memory/offload.py), so the search picks it only where a plan fits with it and not without,
or where the memory it frees buys a faster plan (less recomputation, a larger micro-batch).
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError
from autoplan.types.offload import OFFLOAD_ZERO, runtime_offloads
from autoplan.types.profile import Profile


def check_offload_pin(profile: Profile, fixes: dict, runtime: str) -> None:
    """A pinned offload the profile or the runtime cannot run, or a ZeRO pin it contradicts: one sentence."""
    wanted = fixes.get("offload", "none")
    if wanted == "none":
        return
    if profile.host is None:
        raise PlanError(
            f"--fix offload={wanted} but profile '{profile.name}' has no host section (host memory, link and CPU "
            "Adam rate, docs/profile-format.md); add one, or run `autoplan profile` on the host, or drop the pin."
        )
    if wanted not in runtime_offloads(runtime):
        raise PlanError(f"--fix offload={wanted}: runtime '{runtime}' does not run it; drop the pin.")
    if fixes.get("dp_replicate", 1) > 1:
        raise PlanError(
            f"--fix offload={wanted} with dp_replicate={fixes['dp_replicate']}: the executor offloads without HSDP; "
            "drop one pin."
        )
    if wanted == "full" and fixes.get("pp", 1) > 1:
        raise PlanError(
            f"--fix offload=full with pp={fixes['pp']}: FSDP2's CPU offload runs here without a pipeline; pin pp=1 "
            "or offload=optimizer."
        )
    one_rank = wanted == "optimizer" and fixes.get("zero") == 0 and fixes.get("dp") == 1 and fixes.get("cp", 1) == 1
    if fixes.get("zero", OFFLOAD_ZERO[wanted]) != OFFLOAD_ZERO[wanted] and not one_rank:
        raise PlanError(
            f"--fix offload={wanted} runs on ZeRO-{OFFLOAD_ZERO[wanted]} and --fix zero={fixes['zero']} is not it; "
            f"pin zero={OFFLOAD_ZERO[wanted]} or drop one pin."
        )


def offload_options(profile: Profile, *, deg: Any, zero: int, grads: Any, fixes: dict, runtime: str) -> list[str]:
    """The offloads of one choice (module docstring), narrowed by the pin."""
    check_offload_pin(profile, fixes, runtime)
    options = ["none"]
    if profile.host is not None and deg.dp_cp == 1 and deg.ep * deg.expert_tp == 1 and zero == 0:
        options.append("optimizer")  # ZeRO-Offload on one dp rank (types/offload.py one_rank_offload)
    if profile.host is not None and deg.dp_cp > 1 and deg.ep * deg.expert_tp == 1:
        if zero == 1 and not grads.param_gather:
            options.append("optimizer")
        if zero == 3 and deg.pp == 1:
            options.append("full")
    options = [o for o in options if o == "none" or o in runtime_offloads(runtime)]
    return [o for o in options if o == fixes["offload"]] if "offload" in fixes else options
