"""cost/memory/alone.py fill_memory keeps the last plan's memory (``model.memory.last_fill``): the search prices a
plan's memory alone, then the whole plan, on the same memoised stages (solve/memory_first.py). A plan equal to the
last on the very same stages has its memory copied, priced once; any other plan, or the last one edited since, is
priced again, and each equals the memory a fresh model prices."""

from __future__ import annotations

from dataclasses import replace

from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.cost import CostModel, memory_alone
from autoplan.cost.memory.plan import PlanMemory
from autoplan.types.plan import Plan

GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
PROFILE = replace(synthetic_profile(memory_bytes=int(0.15 * 2**30)), host=synthetic_host())
BASE = Plan(devices=16, dp=4, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16", schedule="1f1b")
WRITTEN = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "comm_buffer_bytes")
WRITTEN += ("peak_memory_bytes", "memory_capacity_bytes", "feasible", "reason")
FILLED_EXTRA = ("host_bytes", "activation_offload")  # the extra entries fill writes (estimate's time adds others)


def _memory(cost) -> dict:
    return {name: getattr(cost, name) for name in WRITTEN} | {k: cost.extra.get(k) for k in FILLED_EXTRA}


def _counted(monkeypatch) -> list[int]:
    calls, fill = [0], PlanMemory.fill

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return fill(self, *args, **kwargs)

    monkeypatch.setattr(PlanMemory, "fill", counted)
    return calls


def test_the_whole_plan_after_its_memory_alone_prices_the_memory_once(monkeypatch):
    calls, model = _counted(monkeypatch), CostModel(GRAPH, PROFILE)
    plan = replace(BASE, offload_activations=True)  # extra entries and the host's part among what is copied
    alone = memory_alone(model, plan)
    whole = model.estimate(replace(plan))  # an equal plan, another object
    assert calls[0] == 1
    assert _memory(alone) == _memory(whole) == _memory(CostModel(GRAPH, PROFILE).estimate(plan))
    assert whole.step_time_s > 0 and whole.extra["activation_offload"] is not alone.extra["activation_offload"]


def test_a_plan_apart_in_any_field_fill_reads_is_priced_again(monkeypatch):
    calls, model = _counted(monkeypatch), CostModel(GRAPH, PROFILE)
    memory_alone(model, BASE)
    for change in (
        dict(zero_stage=3),
        dict(zero_stage=1, offload="optimizer"),
        dict(num_microbatches=16),
        dict(grad_reduce_dtype="bf16"),
    ):
        plan = replace(BASE, **change)  # the same stage totals (none of these is in their key), other memory
        before = calls[0]
        got = memory_alone(model, plan)
        assert calls[0] == before + 1, change
        assert _memory(got) == _memory(memory_alone(CostModel(GRAPH, PROFILE), plan)), change


def test_the_last_plan_edited_since_is_priced_again(monkeypatch):
    model = CostModel(GRAPH, PROFILE)
    plan = replace(BASE)
    first = memory_alone(model, plan)
    plan.zero_stage = 3  # edited in place: the memo's copy is the plan as it was
    again = memory_alone(model, plan)
    assert _memory(again) == _memory(memory_alone(CostModel(GRAPH, PROFILE), plan)) != _memory(first)
