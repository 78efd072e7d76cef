"""--verify of top-k sparsification with error feedback (autoplan/execute/topk_hook.py): the reference
cannot replay each rank's selection from its own mean gradient, but error feedback conserves what is not
sent. Rank i sends ``fed_i - e_i'`` (``fed_i = g_i + e_i``), and the run's gradient is their mean, so

    run gradient = g + ebar - ebar'        (g: the reference's mean gradient, ebar the ranks' mean residual)

which the reference checks at the fp32 tolerance with the residuals the hook keeps (gathered over dp,
before and after the step). At ``topk_ratio`` 1 the residuals stay 0 and this is the exact run; below,
the update itself is approximate and the verdict says so (docs/executor.md, "Top-k sparsification").
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autoplan.execute.job import verify


def mean_residuals(trainer, state) -> dict[str, torch.Tensor]:
    """Each parameter's residual averaged over the hook's dp group, by original FQN (a collective)."""
    found = {}
    ranks = dist.get_world_size(state.group)
    for name, param in verify._named_parameters(trainer):
        residual = state.residual_of(param)
        if residual is None:
            continue
        total = residual.detach().double().clone()
        dist.all_reduce(total, group=state.group)
        found[name] = (total / ranks).cpu()
    return found


def topk_expected(
    grads: dict[str, torch.Tensor], *, trainer, state, feedback: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The gradients the run's top-k step must produce from the mean gradients ``grads`` (module
    docstring); ``feedback`` holds the mean residuals before the step and is updated to those after."""
    after = mean_residuals(trainer, state)
    expected = {}
    for name, grad in grads.items():
        value = grad.double()
        if name in feedback:
            value = value + feedback[name].reshape(grad.shape)
        if name in after:
            value = value - after[name].reshape(grad.shape)
        expected[name] = value.float()
    feedback.clear()
    feedback.update(after)
    return expected


def approximation(plan) -> str:
    """The verdict's words for a top-k step: '' where it must equal the exact run (ratio 1)."""
    if plan.grad_compression != "topk" or plan.topk_ratio >= 1:
        return ""
    return (
        f"top-k at {plan.topk_ratio:.3g} of each bucket: checked as g + ebar - ebar' (error feedback's "
        "conservation); the update is approximate"
    )
