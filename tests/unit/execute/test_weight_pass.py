"""A split backward's W re-runs each recomputed block once (autoplan/execute/weight_pass.py): torch's W runs one
autograd pass per parameter group and its checkpoint re-ran a block in each, three times per LayerNorm-MLP block."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from autoplan.execute.job.meters import LiveBytes
from autoplan.execute.pipeline import build_schedule
from autoplan.execute.recompute import apply_recompute
from autoplan.execute.split_backward import joined_groups
from autoplan.execute.weight_pass import WeightPass, releases
from autoplan.types.plan import Plan
from tests.unit.execute.test_recompute import _normed_stack


@pytest.fixture
def one_rank_mesh():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("pp",))
    dist.destroy_process_group()


def _zero_bubble_step(
    mesh, mode: str, micro_batches: int = 2, *, autocast: bool = False
) -> tuple[dict[int, int], list[torch.Tensor]]:
    """One step of interleaved_zb (pp = 1, two stages of two LayerNorm-MLP blocks) under ``mode``: how often
    each block's forward ran inside a W (``backward_weight_one_chunk``; stage 0's W is torch's full backward),
    and every gradient. ``autocast``: the step under CPU bf16 autocast, whose cached weight casts every
    micro-batch's graph shares."""
    model = _normed_stack(4)
    stages = {i: nn.Sequential(*list(model)[2 * i : 2 * i + 2]) for i in range(2)}
    for stage in stages.values():
        apply_recompute(module=stage, blocks=["0", "1"], mode=mode, split_backward=True)
    plan = Plan(
        devices=1, dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=micro_batches,
        schedule="interleaved_zb", virtual_stages=2, recompute=mode,
    )  # fmt: skip
    schedule = build_schedule(
        stage_modules=stages, plan=plan, pp_mesh=mesh, device=torch.device("cpu"),
        loss_fn=lambda out, target: out.square().sum(),
    )  # fmt: skip
    in_w, reruns = [], dict.fromkeys(range(4), 0)
    for index, block in enumerate(model):
        block[1].up.register_forward_hook(lambda *_, i=index: reruns.__setitem__(i, reruns[i] + bool(in_w)))
    for stage in schedule._stages:

        def weight(chunk, last_backward=False, _run=stage.backward_weight_one_chunk):
            in_w.append(chunk)
            _run(chunk, last_backward=last_backward)
            in_w.pop()

        stage.backward_weight_one_chunk = weight
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
        schedule.step(x, target=torch.zeros(micro_batches))
    return reruns, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_split_backwards_w_reruns_each_recomputed_block_once_per_micro_batch(one_rank_mesh, mode):
    """Each block re-runs once per micro-batch in W, as priced; before, stage 1's blocks re-ran three times (one
    per parameter group: the norm's, each linear's), 6 on 2 micro-batches. Gradients equal no recomputation's."""
    _, reference = _zero_bubble_step(one_rank_mesh, "none")
    reruns, grads = _zero_bubble_step(one_rank_mesh, mode)
    assert reruns == {0: 2, 1: 2, 2: 2, 3: 2}
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_weight_cast_shared_by_micro_batches_outliving_its_tagging_block_is_passed_over(one_rank_mesh):
    """Under autocast the first micro-batch's block tags the cached cast of each weight, which the second
    micro-batch's graph reuses after the first's re-run has ended: its B failed with "weak object has gone away"
    (an audit at bf16). W still re-runs each block once, with no recomputation's gradients."""
    _, reference = _zero_bubble_step(one_rank_mesh, "none", autocast=True)
    reruns, grads = _zero_bubble_step(one_rank_mesh, "full", autocast=True)
    assert reruns == {0: 2, 1: 2, 2: 2, 3: 2}
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want)


def _w_peak(ends_each_block: bool) -> tuple[int, list[torch.Tensor]]:
    """W's peak bytes over 4 fully recomputed blocks (torch's stage_backward_input, then its stage_backward_weight
    under a WeightPass, as the executor runs them), ending each block's re-run after its last group or at W's end."""
    model = _normed_stack(4)
    apply_recompute(module=model, blocks=[str(i) for i in range(4)], mode="full", split_backward=True)
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    (dx,), groups = stage_backward_input([model(x).square().sum()], None, [x], model.parameters())
    groups, nodes = joined_groups(groups)
    with LiveBytes([*model.parameters(), x]) as live:
        live.peak = start = live.current
        with WeightPass(releases(nodes) if ends_each_block else None) as weight_pass:
            stage_backward_weight(model.parameters(), weight_pass.over(groups))
    return live.peak - start, [dx, *(p.grad for p in model.parameters())]


def test_w_ends_each_blocks_rerun_after_its_last_parameter_group():
    """W keeps a block's re-run from its first group to its last, then ends it, so W holds one block's re-run
    and not what earlier blocks' groups never read (each GELU's input) as well; the gradients are the same."""
    held_to_the_end, grads_at_end = _w_peak(ends_each_block=False)
    ended, grads = _w_peak(ends_each_block=True)
    assert ended < held_to_the_end
    for got, want in zip(grads, grads_at_end, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_rerun_ended_before_a_group_that_reads_it_is_run_again_not_missed(mode):
    """A block node left untagged would end the block's re-run too early; the next group that reads it then
    re-runs the block (what W did before, once per group) with the same gradients, rather than missing a
    tensor. Here every re-run is ended after every group: 3 re-runs per block, as before the change."""
    counts, grads = {}, {}
    for premature in (False, True):
        model = _normed_stack(2)
        apply_recompute(module=model, blocks=["0", "1"], mode=mode, split_backward=True)
        in_w, runs = [], [0]
        for block in model:
            block[1].up.register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + bool(in_w)))
        x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        (dx,), groups = stage_backward_input([model(x).square().sum()], None, [x], model.parameters())
        groups, nodes = joined_groups(groups)
        after = releases(nodes)
        if premature:
            after = [[frame for ended in after for frame in ended] for _ in after]
        in_w.append(True)
        with WeightPass(after) as weight_pass:
            stage_backward_weight(model.parameters(), weight_pass.over(groups))
        counts[premature], grads[premature] = runs[0], [p.grad for p in model.parameters()]
    assert counts == {False: 2, True: 6}
    for got, want in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
