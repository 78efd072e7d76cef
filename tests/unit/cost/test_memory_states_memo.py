"""cost/memory/plan.py: a plan's stages alike in the four parameter counts PlanMemory._states reads (dense and
expert parameters, and the trained ones of each) share one model-states answer per plan, and every stage's weights,
gradients and optimizer bytes are those _states gives it alone, whichever count sets it apart."""

from __future__ import annotations

from dataclasses import astuple

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel
from autoplan.cost.memory.plan import PlanMemory
from autoplan.types.plan import Plan

GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
PROFILE = synthetic_profile(memory_bytes=int(0.15 * 2**30))
PLAN = Plan(devices=8, dp=2, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16", zero_stage=1)


def _counted(monkeypatch) -> list[int]:
    calls, states = [0], PlanMemory._states

    def counted(self, plan, stage):
        calls[0] += 1
        return states(self, plan, stage)

    monkeypatch.setattr(PlanMemory, "_states", counted)
    return calls


def _counts(stage) -> tuple:
    return stage.dense_params, stage.trainable_dense_params, stage.expert_params, stage.trainable_expert_params


def test_stages_alike_share_their_states_and_each_has_its_own(monkeypatch):
    model = CostModel(GRAPH, PROFILE)
    stages, _, _ = model.priced_stages(PLAN)  # copies, edited below
    stages[0].frozen_params += 1000.0  # apart in the trained counts only; stages 1 and 2 alike
    stages[3].expert_params += 64.0  # and in the experts'
    stages[3].params += 64.0
    calls = _counted(monkeypatch)
    memory = model.stage_memory(PLAN, stages)
    assert calls[0] == len({_counts(stage) for stage in stages}) < len(stages)  # stage 2 priced with stage 1's
    for stage, got in zip(stages, memory):
        want = astuple(model.memory._states(PLAN, stage))
        assert (got.weights_bytes, got.grads_bytes, got.optimizer_bytes) == want
