"""A hand-written plan with sequence parallelism on a sequence tp does not divide is one sentence.

The planner never offers it (autoplan/solve/sequence_parallel.py; tests/unit/solve/
test_sequence_parallel_options.py); a plan written by hand, or for another sequence length, once
ran with the 7-token decoder of tests/odd_models/two_sequences.py sharded 4 + 3 and rebuilt as 8
positions on one rank and 6 on the other. One process as rank 0 of a fake 2-rank group: the guard
fires before any collective would need data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.errors import PlanError
from autoplan.execute.api import parallelize
from autoplan.modelfile import load_model_file
from autoplan.types.plan import Plan

MODEL = load_model_file(Path(__file__).resolve().parents[1] / "odd_models" / "two_sequences.py")


@pytest.fixture
def fake_rank_0_of_2():
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


def test_sp_on_a_sequence_tp_does_not_divide_is_refused_in_one_sentence(fake_rank_0_of_2):
    plan = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=2, num_microbatches=1, sequence_parallel=True)
    torch.manual_seed(0)
    inputs = MODEL.inputs(2)
    trainer = parallelize(MODEL.build(), plan, loss_fn=MODEL.loss, microbatch_inputs=inputs)
    with pytest.raises(PlanError, match=r"^plan sequence_parallel shards the sequence of ") as caught:
        trainer.train_step(inputs, MODEL.target(2))  # the encoder's 8 tokens pass; the decoder's 7 do not
    assert "(7 positions) over tp=2, which does not divide it" in str(caught.value)
