"""Local SGD and DiLoCo over the data-parallel replicas (``Plan.sync_every``, ``Plan.outer_optimizer``,
``Plan.outer_lr``, ``Plan.outer_momentum``; docs/cost-model.md, "Local SGD and DiLoCo").

Each replica runs the plan's normal step (its tp, pp and any ZeRO inside); every H = ``sync_every`` steps
the replicas' parameters are averaged over the *outer group*, and between those syncs the gradients are not
all-reduced across it. The outer group is the replica axis: under HSDP (``dp_replicate`` = R > 1) the R
replicas of each shard (ZeRO/FSDP shards within a site, the outer sync across sites); otherwise every dp
rank at ZeRO-0, each rank a whole replica. At H = 1 the plan is synchronous, as today.

- "average": local SGD (Stich, ICLR'19; Lin et al., ICLR'20 post-local SGD): theta <- mean_r theta_r.
- "nesterov": DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1): with the anchor theta_0 (the
  parameters after the last outer sync), the outer gradient Delta = theta_0 - mean_r theta_r, and Nesterov
  SGD (torch.optim.SGD(nesterov=True)): m <- mu m + Delta; theta_0 <- theta_0 - lr (Delta + mu m);
  theta_r <- theta_0. The paper's values: lr = 0.7, mu = 0.9 (its section 3). At lr 1, mu 0 it is "average".
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError
from autoplan.types.hsdp import dp_shard

OUTER_OPTIMIZERS = ("average", "nesterov")
#: DiLoCo's outer learning rate and Nesterov momentum (Douillard et al. 2023, section 3)
DILOCO_OUTER_LR = 0.7
DILOCO_OUTER_MOMENTUM = 0.9


def synchronous_fields() -> dict[str, Any]:
    """The plan fields of a synchronous plan (``dataclasses.replace(plan, **synchronous_fields())``)."""
    return dict(sync_every=1, outer_optimizer="average", outer_lr=DILOCO_OUTER_LR, outer_momentum=DILOCO_OUTER_MOMENTUM)


def is_local_sgd(plan: Any) -> bool:
    """Whether the plan runs an outer sync at all (H > 1, or an outer optimizer on a synchronous plan)."""
    return plan.sync_every > 1 or plan.outer_optimizer != "average"


def equals_synchronous(plan: Any) -> bool:
    """Whether the plan trains exactly as its synchronous twin: H = 1 with plain averaging (the replicas
    are equal already) or with Nesterov at lr 1 and momentum 0 (anchor - (anchor - avg) = avg)."""
    plain = plan.outer_optimizer == "average" or (plan.outer_lr, plan.outer_momentum) == (1, 0)
    return plan.sync_every == 1 and plain


def outer_degree(plan: Any) -> int:
    """The replicas the outer sync averages over (module docstring): dp_replicate under HSDP, else dp."""
    return plan.dp_replicate if plan.dp_replicate > 1 else plan.dp


def inner_dp(plan: Any) -> int:
    """The dp ranks that still sync gradients every step: the shard group under HSDP, else 1 (at H > 1);
    every dp rank at H = 1."""
    if plan.sync_every == 1:
        return plan.dp
    return dp_shard(plan) if plan.dp_replicate > 1 else 1


def outer_state_bytes_per_param(plan: Any) -> int:
    """Bytes the outer optimizer keeps per parameter it holds: an fp32 anchor and an fp32 momentum for
    "nesterov" (8), nothing for "average"."""
    return 8 if plan.outer_optimizer == "nesterov" else 0


def describe_local_sgd(plan: Any) -> str:
    """The plan's one-line summary's part, e.g. `` diloco=500(lr0.7,m0.9)`` or `` localsgd=8``; '' when synchronous."""
    if not is_local_sgd(plan):
        return ""
    if plan.outer_optimizer == "average":
        return f" localsgd={plan.sync_every}"
    return f" diloco={plan.sync_every}(lr{plan.outer_lr:g},m{plan.outer_momentum:g})"


def check_local_sgd(plan: Any) -> None:
    """The rules of the outer sync, one sentence each (module docstring)."""
    h, name = plan.sync_every, plan.outer_optimizer
    if not (isinstance(h, int) and not isinstance(h, bool) and h >= 1):
        raise PlanError(f"plan sync_every={h!r}; expected an integer >= 1 (1 = synchronous).")
    if name not in OUTER_OPTIMIZERS:
        raise PlanError(f"plan outer_optimizer='{name}'; expected one of {', '.join(OUTER_OPTIMIZERS)}.")
    _check_outer_hyper(plan)
    if not is_local_sgd(plan):
        return
    refusal = outer_sync_refusal(plan)
    if refusal:
        raise PlanError(f"plan sync_every={h} outer_optimizer='{name}' with {plan.describe()}: {refusal}")


def outer_sync_refusal(plan: Any) -> str:
    """Why the executor cannot run an outer sync on ``plan``'s layout (its dp, zero_stage, dp_replicate, ep, cp,
    grad_compression, offload and runtime), in one sentence; '' when it can (the search asks too)."""
    if outer_degree(plan) < 2:
        return "the outer sync averages replicas, so it needs dp > 1 (zero_stage 0) or dp_replicate > 1 (HSDP)."
    if plan.zero_stage > 0 and plan.dp_replicate == 1:
        return (
            f"ZeRO-{plan.zero_stage} shards the states over every dp rank, which leaves no replicas to average; use "
            "zero_stage 0, or dp_replicate > 1 for ZeRO within each replica and the outer sync across them (HSDP)."
        )
    if plan.zero_stage == 1:
        return (
            "ZeRO-1's fp32 master slices would have to be averaged beside the weights; use zero_stage 2 or 3 "
            "(FSDP2, whose shards are the optimizer's parameters)."
        )
    if not (plan.ep == 1 and plan.cp == 1 and plan.grad_compression == "none" and plan.offload == "none"):
        return (
            "the outer sync composes with tp, pp and ZeRO/HSDP so far; use ep = 1, cp = 1, grad_compression "
            "'none' and offload 'none'."
        )
    if plan.runtime != "autoplan":
        return f"only autoplan's executor runs the outer sync, not runtime '{plan.runtime}'."
    return ""


def _check_outer_hyper(plan: Any) -> None:
    """outer_lr > 0 and 0 <= outer_momentum < 1, set away from DiLoCo's values only with "nesterov"."""
    lr, mu = plan.outer_lr, plan.outer_momentum
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0):
        raise PlanError(f"plan outer_lr={lr!r}; expected a number > 0.")
    if not (isinstance(mu, (int, float)) and not isinstance(mu, bool) and 0 <= mu < 1):
        raise PlanError(f"plan outer_momentum={mu!r}; expected a number in [0, 1).")
    if plan.outer_optimizer == "average" and (lr, mu) != (DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM):
        raise PlanError(
            f"plan outer_lr={lr} outer_momentum={mu} with outer_optimizer 'average': plain averaging has no outer "
            "step; use outer_optimizer 'nesterov' or leave them out."
        )
