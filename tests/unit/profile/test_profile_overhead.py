"""Host dispatch overhead per op (profile/measure/overhead.py): the slope arithmetic, the chains
it times, a real measurement on this CPU, and the merge over ranks into ``device.op_overhead``."""

from __future__ import annotations

import math

import pytest
import torch

from autoplan.errors import ProfileError
from autoplan.profile.measure import merge_overhead
from autoplan.profile.measure.overhead import KINDS, WIDTH, chain_calls, per_op_slope_s, time_op_overhead
from autoplan.profile.measure.ranks import RankResult
from autoplan.types.profile import OpOverhead


def test_slope_recovers_a_known_per_op_time_from_synthetic_points() -> None:
    fixed_s, per_op_s = 3e-5, 4.2e-6
    assert per_op_slope_s([(n, fixed_s + per_op_s * n) for n in (8, 72)]) == pytest.approx(per_op_s, rel=1e-9)
    noisy = [(n, fixed_s + per_op_s * n + noise) for n, noise in ((8, 1e-7), (24, -2e-7), (48, 2e-7), (72, -1e-7))]
    assert per_op_slope_s(noisy) == pytest.approx(per_op_s, rel=0.02)


def test_slope_needs_two_lengths() -> None:
    with pytest.raises(ProfileError, match="two or more lengths"):
        per_op_slope_s([(8, 1e-5), (8, 2e-5)])


def _autograd_nodes(root: object) -> int:
    """Distinct autograd nodes reachable from ``root``, leaves (AccumulateGrad) not counted."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(id(node))
        todo.extend(fn for fn, _ in node.next_functions)
    return len(seen)


@pytest.mark.parametrize("kind", KINDS)
def test_a_chain_records_one_autograd_node_per_op_and_yields_every_gradient(kind: str) -> None:
    forward, step = chain_calls(kind, 6, torch.device("cpu"))
    out = forward()
    per_op = 2 if kind == "linear" else 1  # F.linear also records the weight's transpose (TBackward)
    assert _autograd_nodes(out.grad_fn) == 6 * per_op and out.numel() == WIDTH and torch.isfinite(out).all()
    grads = step()
    params = {"linear": 2 * 6, "layer_norm": 2 * 6}.get(kind, 0)
    assert len(grads) == 1 + params and all(torch.isfinite(g).all() for g in grads)


def test_measured_overhead_on_this_cpu_is_positive_with_a_backward() -> None:
    forward_s, backward_s = time_op_overhead(device=torch.device("cpu"), budget_s=0.005)
    assert math.isfinite(forward_s) and math.isfinite(backward_s)
    assert forward_s > 0 and backward_s > 0


def test_merge_takes_the_median_over_ranks_and_sources_it() -> None:
    per_rank = {
        r: RankResult(compute_s=[], memory=None, collectives={}, op_overhead=(f, b))
        for r, (f, b) in enumerate(((1e-6, 5e-6), (3e-6, 2e-6), (2e-6, 9e-6)))
    }
    merged = merge_overhead(per_rank, how="3 ranks at once")
    assert isinstance(merged, OpOverhead) and (merged.forward_s, merged.backward_s) == (2e-6, 5e-6)
    assert "chain length" in merged.source and "3 ranks at once" in merged.source
    merged.check()
    assert merge_overhead({0: RankResult(compute_s=[], memory=None, collectives={})}, how="x") is None
