"""The executor on meshes of 64-256 ranks, in one process: torch's fake process group.

A fake group (``torch.testing._internal.distributed.fake_pg``) lets one process be any rank of
any world size: every collective returns at once without data, but DeviceMesh, DTensor
placements, FSDP2 sharding and the pipeline split run as on a real cluster. So this tier checks
what the gloo tier cannot reach on 2-4 CPU ranks: the mesh coordinates of a rank deep inside a
large job, and every parameter's placements and local shard shape under tp x dp x pp, derived
here from the plan's own splits (not from the executor's tables).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.execute.api import parallelize, with_default_tp_plan
from autoplan.execute.mesh import coordinates
from autoplan.modelfile import load_model_file
from autoplan.types.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
GPT = load_model_file(ROOT / "examples" / "gpt.py")


@pytest.fixture
def fake_rank():
    """``join(rank, world)`` makes this process that rank of a fake group; left on teardown."""

    def join(rank: int, world: int) -> None:
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())

    yield join
    if dist.is_initialized():
        dist.destroy_process_group()


def _parallelized(plan: Plan):
    torch.manual_seed(0)
    model = GPT.build()
    plan = with_default_tp_plan(model=model, plan=plan, microbatch_inputs=GPT.inputs(plan.micro_batch_size))
    trainer = parallelize(model, plan, loss_fn=GPT.loss, microbatch_inputs=GPT.inputs(plan.micro_batch_size))
    return trainer, plan


def _tp_dim(module: torch.nn.Module, name: str, split: str) -> int | None:
    """The dim of parameter ``name`` that the tp split ``split`` divides (None: whole), from the
    split's meaning in docs/architecture.md."""
    if isinstance(module, torch.nn.Embedding):
        return {"colwise": 1, "rowwise": 0}.get(split)
    if isinstance(module, torch.nn.Linear):
        if split == "colwise":
            return 0
        if split == "rowwise" and name == "weight":
            return 1
    return None


@pytest.mark.parametrize("world, dp, cp, tp, rank", [(64, 8, 1, 8, 13), (128, 8, 2, 8, 77), (256, 64, 1, 4, 255)])
def test_a_rank_deep_in_the_mesh_has_its_coordinates_and_shards(fake_rank, world, dp, cp, tp, rank):
    fake_rank(rank, world)
    plan = Plan(
        devices=world, dp=dp, cp=cp, tp=tp, pp=1, micro_batch_size=1, num_microbatches=1, sequence_parallel=True
    )
    trainer, plan = _parallelized(plan)
    expected = {"pp": 0, "dp": rank // (cp * tp) % dp, "cp": rank // tp % cp, "tp": rank % tp}  # tp innermost
    assert coordinates(trainer.mesh) == expected
    if cp > 1:  # the ranks that sync gradients: the dp x cp ranks holding this rank's tp shard
        assert dist.get_process_group_ranks(trainer.grad_mesh.get_group()) == list(range(rank % tp, world, tp))
    model = trainer.stage_modules[0]
    global_shapes = {n: tuple(p.shape) for n, p in GPT.build().named_parameters(remove_duplicate=False)}
    split_count = 0
    for fqn, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{fqn}.{name}" if fqn else name
            dim = _tp_dim(module, name, plan.tp_plan.get(fqn, "replicate"))
            assert isinstance(param, DTensor) or dim is None, full
            local = tuple(param.to_local().shape) if isinstance(param, DTensor) else tuple(param.shape)
            expected = list(global_shapes[full])
            if dim is not None:
                expected[dim] //= tp
                split_count += 1
                assert param.placements == (Shard(dim),), full
            elif isinstance(param, DTensor):
                assert param.placements == (Replicate(),), full
            assert local == tuple(expected), full
    assert split_count >= 4 * 4  # every block's qkv, proj, fc and fc2 at least


def test_fsdp_shards_each_tp_shard_over_the_dp_ranks(fake_rank):
    world, dp, tp = 128, 16, 8
    fake_rank(77, world)
    plan = Plan(
        devices=world,
        dp=dp,
        tp=tp,
        pp=1,
        micro_batch_size=1,
        num_microbatches=1,
        sequence_parallel=True,
        zero_stage=3,
        precision="bf16",
    )
    trainer, plan = _parallelized(plan)
    model = trainer.stage_modules[0]
    global_shapes = {n: tuple(p.shape) for n, p in GPT.build().named_parameters(remove_duplicate=False)}
    for full, param in model.named_parameters():
        assert isinstance(param, DTensor) and param.device_mesh.mesh_dim_names == ("dp", "tp"), full
        assert tuple(param.shape) == global_shapes[full], full
        tp_share = param.numel() // (tp if param.placements[1] != Replicate() else 1)
        assert param.to_local().numel() == -(-tp_share // dp) or param.to_local().numel() == tp_share // dp, full


def test_a_pipeline_rank_holds_only_its_stage(fake_rank):
    world, dp, tp, pp = 64, 4, 4, 4
    rank = 3 * dp * tp + 5  # pipeline stage 3 (the last), dp 1, tp 1
    fake_rank(rank, world)
    blocks = [f"transformer.h.{i}" for i in range(4)]
    plan = Plan(
        devices=world,
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=1,
        num_microbatches=4,
        stages=[[b] for b in blocks],
        sequence_parallel=True,
    )
    trainer, plan = _parallelized(plan)
    assert coordinates(trainer.mesh) == {"pp": 3, "dp": 1, "cp": 0, "tp": 1}
    assert list(trainer.stage_modules) == [3]
    held = {n for n, _ in trainer.stage_modules[3].named_parameters()}
    assert any(n.startswith("transformer.h.3.") for n in held)
    assert not any(n.startswith(("transformer.h.0.", "transformer.h.1.", "transformer.h.2.")) for n in held)
    assert any("lm_head" in n or "wte" in n for n in held)  # the head (tied or not) is on the last stage
