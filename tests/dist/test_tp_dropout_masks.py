"""Dropout masks under tensor parallelism on real gloo groups (autoplan/execute/rng.py).

A two-layer MLP with dropout on the column-parallel hidden units (a sharded activation) and on
the output of the row-parallel layer (replicated, or sequence-sharded under SP) runs one
training step through ``parallelize``; forward hooks record where each rank's local output of
each dropout is zero. Megatron's rule: the tp ranks draw the same mask on a replicated
activation, and independent masks on the shards of a sharded one."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from exec_harness import _spawn
from torch.distributed.tensor import DTensor

from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow

P = 0.5
BATCH, SEQ, DIM, HIDDEN = 2, 8, 32, 64


class DropoutMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.hidden_dropout = nn.Dropout(P)
        self.down = nn.Linear(HIDDEN, DIM)
        self.out_dropout = nn.Dropout(P)

    def forward(self, x):
        return self.out_dropout(self.down(self.hidden_dropout(self.up(x))))


def _square_loss(output, _target):
    return output.pow(2).mean()


def masks_case(_model_name: str, given: Plan) -> dict:
    """Two steps of the MLP; every rank's dropout masks (True = dropped), gathered on rank 0,
    with the drop rate, and any DTensor RNG warning seen."""
    from autoplan.execute import parallelize

    sp = given.sequence_parallel
    plan = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=BATCH, num_microbatches=1, sequence_parallel=sp,
                tp_plan={"up": "colwise", "down": "rowwise"})  # fmt: skip
    torch.manual_seed(0)
    trainer = parallelize(DropoutMLP(), plan, loss_fn=_square_loss)
    masks: dict[str, list] = {}

    def record(name):
        def hook(_module, _args, output):
            local = output.to_local() if isinstance(output, DTensor) else output
            masks.setdefault(name, []).append((local == 0).flatten().tolist())

        return hook

    for name in ("hidden_dropout", "out_dropout"):
        getattr(trainer.model, name).register_forward_hook(record(name))
    x = torch.randn(BATCH, SEQ, DIM)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(2):
            torch.manual_seed(100 + step)
            trainer.train_step((x,), None)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, masks)
    return {"masks": everyone, "warnings": [str(w.message) for w in seen if "random" in str(w.message)]}


@pytest.fixture(scope="module")
def masks():
    return _spawn(2, [("tp", "gpt", dict(tp=2)), ("tp_sp", "gpt", dict(tp=2, sequence_parallel=True))], masks_case)


def _ranks(results: dict, case: str, name: str) -> tuple[list, list]:
    assert "error" not in results[case], results[case].get("error")
    rank0, rank1 = results[case]["masks"]
    return rank0[name], rank1[name]


def _rate(mask: list[bool]) -> float:
    return sum(mask) / len(mask)


@pytest.mark.parametrize("case", ["tp", "tp_sp"])
def test_sharded_activations_get_independent_masks(masks, case):
    """The column-parallel hidden units: each rank holds half of them; their masks differ (equal
    seeds without a tracker drew the same pattern on both halves), each dropping about P."""
    rank0, rank1 = _ranks(masks, case, "hidden_dropout")
    for step in range(2):
        assert rank0[step] != rank1[step]
        agree = sum(a == b for a, b in zip(rank0[step], rank1[step])) / len(rank0[step])
        assert 0.3 < agree < 0.7  # independent Bernoulli(0.5) masks agree on about half the elements
        assert 0.35 < _rate(rank0[step]) < 0.65 and 0.35 < _rate(rank1[step]) < 0.65
    assert rank0[0] != rank0[1]  # and a new mask every step


def test_replicated_activations_get_equal_masks(masks):
    """The row-parallel output, all-reduced to a replicated tensor: both ranks drop the same
    elements, or the replicas of one tensor would diverge."""
    rank0, rank1 = _ranks(masks, "tp", "out_dropout")
    for step in range(2):
        assert rank0[step] == rank1[step] and 0.35 < _rate(rank0[step]) < 0.65


def test_sequence_sharded_activations_get_independent_masks(masks):
    """Under SP the row-parallel output is reduce-scattered along the sequence: a sharded activation."""
    rank0, rank1 = _ranks(masks, "tp_sp", "out_dropout")
    assert rank0[0] != rank1[0] and 0.35 < _rate(rank0[0]) < 0.65


def test_no_dtensor_rng_warning(masks):
    assert masks["tp"]["warnings"] == [] and masks["tp_sp"]["warnings"] == []
