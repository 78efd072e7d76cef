"""The TP ILP charges each split what the step charges its parameters once a step (cost/dp/param_step.py).

A split sets how many parameters a rank holds, and so its share of the dp gradient sync and the optimizer step
that run once a step, outside the micro-batch the block ILP prices. On a wide MLP fed few tokens over a slow tp
link, replicating the linears saves a micro-batch its all-reduces, while their 2 x 8.4M parameters, held whole,
double what ZeRO-1's reduce-scatter, gather and Adam step move: the step is slower. With the term the ILP splits.
"""

import dataclasses
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from synthetic import synthetic_profile

from autoplan.cost import CostModel, MemoryBudget, ParamStepPrice, block_step_s, price_block, rank_params, split_context
from autoplan.solve import tp_plan
from autoplan.solve.api import plan_graph
from autoplan.solve.intra_op import objective_s, solve_block
from autoplan.solve.tp_plan import TPPlanner
from autoplan.trace import trace
from autoplan.types.plan import Plan

BATCH, SEQ, DIM = 2, 4, 2048
FACTORS = dict(param_bytes_factor=4.0, activation_factor=0.5)
FIX = "tp=2,dp=2,pp=1,mbs=1,zero=1,precision=bf16,sp=off,recompute=none"


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(DIM, DIM), nn.GELU(), nn.Linear(DIM, DIM)) for _ in "ab"])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def graph():
    x, target = torch.randn(BATCH, SEQ, DIM), torch.randn(BATCH, SEQ, DIM)
    return trace(Mlp(), (x,), loss_fn=lambda out, t: F.mse_loss(out, t), target=target)


def _profile():
    return synthetic_profile(intra_busbw_bytes_per_s=2e9)  # a slow tp (and dp) link: the all-reduces are dear


def test_the_ilp_splits_what_the_step_charges_whole(graph):
    profile = _profile()
    best = plan_graph(graph, devices=4, profile=profile, batch_size=BATCH, fix=FIX).best
    assert {best.tp_plan[f"layers.{i}.{j}"] for i in "01" for j in "02"} == {"colwise", "rowwise"}
    replicated = dataclasses.replace(best, tp_plan={name: "replicate" for name in best.tp_plan})
    model = CostModel(graph, profile)
    split_cost, replicated_cost = model.estimate(best), model.estimate(replicated)
    assert split_cost.step_time_s < replicated_cost.step_time_s
    # a micro-batch alone is faster replicated: the ILP without the step term replicates
    assert replicated_cost.tp_comm_s == 0 and split_cost.tp_comm_s > 0
    micro_batch = lambda c: c.compute_s + c.tp_comm_s  # noqa: E731
    assert micro_batch(replicated_cost) < micro_batch(split_cost)


def test_the_step_term_is_what_the_step_charges_the_parameters(graph):
    """Per split, the step's dp sync and optimizer seconds of the block's parameters (ZeRO-1, tp = 2, one micro-batch:
    the sync is never hidden), as CostModel charges them at those splits."""
    profile = _profile()
    fields = dict(devices=4, dp=2, tp=2, pp=1, micro_batch_size=1, num_microbatches=BATCH, precision="bf16")
    plan = Plan(**fields, zero_stage=1)
    model = CostModel(graph, profile)
    step = ParamStepPrice(plan, profile, model.dp_terms)
    ctx = split_context(graph, profile, dp=2, tp=2, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=1)
    terms = {layer: block_step_s(graph, layer, ctx, step) for layer in graph.layers}
    for split in ("replicate", "colwise"):
        tp_plan = {f"layers.{i}.{j}": split for i in "01" for j in "02"}
        cost = model.estimate(dataclasses.replace(plan, tp_plan=tp_plan))
        assert sorted(graph.node(v).module for t in terms.values() for v in t) == sorted(tp_plan)
        charged = sum(t[v][split] for t in terms.values() for v in t)
        # the step's charge: one message per block where the term prices one per node (an alpha each, the same
        # for every split)
        assert charged == pytest.approx(cost.dp_comm_exposed_s + cost.optimizer_s, rel=0.05)


def _plain(graph, profile, ctx, step, limit_of) -> dict[str, str]:
    """The plain computation: every block's ILP solved with its step term (a step's seconds over m)."""
    splits = {}
    for rep in [None, *(g.layers[0] for g in graph.groups)]:
        problem = price_block(graph, rep, ctx=ctx, **FACTORS)
        per_step = block_step_s(graph, rep, ctx, step)
        step_s = {v: {s: t / step.num_microbatches for s, t in table.items()} for v, table in per_step.items()}
        problem = dataclasses.replace(problem, step_s=step_s)
        splits[rep] = solve_block(problem, memory_budget_bytes=limit_of(rep)), problem
    return splits


@pytest.mark.parametrize("slow", [True, False])
def test_the_answer_without_the_term_stands_where_its_splits_pay_the_least_step(graph, slow):
    """TPPlanner answers from the ILP without the term where its splits already pay each node's least step seconds:
    the same optimum as the ILP with it, over ZeRO stages, micro-batch counts, dp degrees and budgets (which the
    test varies); the tight budget leaves only the lightest, sharded, splits."""
    profile = _profile() if slow else synthetic_profile()
    planner, solves = TPPlanner(graph, profile), 0
    for zero, m, dp, loose in itertools.product((0, 1, 3), (1, 8), (2, 4), (True, False)):
        plan = Plan(devices=2 * dp, dp=dp, tp=2, pp=1, micro_batch_size=1, num_microbatches=m, zero_stage=zero)
        step = ParamStepPrice(plan, profile, CostModel(graph, profile).dp_terms)
        kw = dict(dp=dp, tp=2, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=1)
        ctx = split_context(graph, profile, **kw)
        lightest = {rep: price_block(graph, rep, ctx=ctx, **FACTORS).min_memory_bytes() for rep in [None, "layers.0"]}
        limit_of = lambda rep: lightest[rep if rep is None else "layers.0"] * (4 if loose else 1.02)  # noqa: E731
        budget = MemoryBudget(block_bytes=limit_of("layers.0"), outside_bytes=limit_of(None), **FACTORS)
        before = planner.solves
        choice = planner.choose(**kw, budget=budget, step=step)
        solves += planner.solves - before
        plain_answers = _plain(graph, profile, ctx, step, limit_of).values()
        for (plain, problem), status in zip(plain_answers, choice.statuses):
            splits = {v: choice.tp_plan[graph.node(v).module] for v in problem.params}
            assert objective_s(problem, splits) == pytest.approx(objective_s(problem, plain.splits), rel=1e-6)
            assert status.objective == pytest.approx(plain.status.objective, rel=1e-6)
    # without the check, the ILP with the term alone is solved once per step key and budget for each block (the
    # nodes outside the layers and the two layers: the last feeds the loss), 24 x 3
    assert solves < 24 * 3, solves


def test_step_keys_apart_in_micro_batches_share_a_step_table_and_equal_splits_one_tp_plan(graph, monkeypatch):
    """TPPlanner prices a block's step seconds once per what a step reads (ZeRO-1's messages go once a step, so
    m = 1 and 8 read alike) and makes one tp_plan object per splits; every choice is a fresh planner's."""
    profile, priced = synthetic_profile(), []
    monkeypatch.setattr(tp_plan, "block_step_s", lambda *a, **k: priced.append(a[1]) or block_step_s(*a, **k))
    planner, kw = TPPlanner(graph, profile), dict(dp=2, tp=2, pp=1, sequence_parallel=False, precision="bf16")
    choices = []
    for m, mbs in itertools.product((1, 8), (1, 2)):
        plan = Plan(devices=4, dp=2, tp=2, pp=1, micro_batch_size=mbs, num_microbatches=m, zero_stage=1)
        step = ParamStepPrice(plan, profile, CostModel(graph, profile).dp_terms)
        choices.append(planner.choose(**kw, micro_batch_size=mbs, step=step))
        fresh = TPPlanner(graph, profile).choose(**kw, micro_batch_size=mbs, step=step)
        assert dict(choices[-1].tp_plan) == dict(fresh.tp_plan)
        assert [s.objective for s in choices[-1].statuses] == pytest.approx([s.objective for s in fresh.statuses])
    assert sorted(priced, key=str) == sorted([None, "layers.0", "layers.1"] * 5, key=str)  # 4 fresh + 1 shared
    plans = {id(c.tp_plan): dict(c.tp_plan) for c in choices}
    assert len(plans) == len({tuple(sorted(p.items())) for p in plans.values()})


def _step(graph, profile, *, dp: int, m: int, zero: int) -> ParamStepPrice:
    plan = Plan(devices=2 * dp, dp=dp, tp=2, pp=1, micro_batch_size=1, num_microbatches=m, zero_stage=zero)
    return ParamStepPrice(plan, profile, CostModel(graph, profile).dp_terms)


def test_rank_params_are_kept_per_block_tp_and_sp(graph, monkeypatch):
    """TPPlanner reads a block's rank_params once per block, tp and SP, whatever the step (ZeRO stage, m, dp): every
    choice is the one a planner that reads them afresh makes."""
    profile, kw = synthetic_profile(), dict(tp=2, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=1)
    steps = [(dp, _step(graph, profile, dp=dp, m=m, zero=z)) for z, m, dp in itertools.product((0, 3), (1, 8), (2, 4))]
    fresh = [TPPlanner(graph, profile).choose(**kw, dp=dp, step=step) for dp, step in steps]
    read = []
    monkeypatch.setattr(tp_plan, "rank_params", lambda g, rep, **k: read.append(rep) or rank_params(g, rep, **k))
    planner = TPPlanner(graph, profile)
    for (dp, step), plain in zip(steps, fresh):
        choice = planner.choose(**kw, dp=dp, step=step)
        assert dict(choice.tp_plan) == dict(plain.tp_plan)
        assert [s.objective for s in choice.statuses] == [s.objective for s in plain.statuses]
    assert sorted(read, key=str) == sorted([None, "layers.0", "layers.1"], key=str)  # not once per step key


def test_the_answer_with_the_term_is_kept_on_its_key(graph, monkeypatch):
    """TPPlanner keeps a block's answer with the step term on the block, fingerprint, tp, step key and limit: budgets
    apart only in the layers' limit read the outside nodes' step seconds once, and each choice is a fresh planner's."""
    profile, kw = (
        synthetic_profile(),
        dict(dp=2, tp=2, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=1),
    )
    ctx, step = split_context(graph, profile, **kw), _step(graph, profile, dp=2, m=8, zero=1)
    lightest = {rep: price_block(graph, rep, ctx=ctx, **FACTORS).min_memory_bytes() for rep in (None, "layers.0")}
    budgets = [
        MemoryBudget(block_bytes=lightest["layers.0"] * f, outside_bytes=lightest[None] * 4, **FACTORS)
        for f in (4, 2, 1.02)
    ]
    fresh = [TPPlanner(graph, profile).choose(**kw, budget=budget, step=step) for budget in budgets]
    read, step_s = [], TPPlanner._step_s
    monkeypatch.setattr(TPPlanner, "_step_s", lambda self, rep, *a, **k: read.append(rep) or step_s(self, rep, *a, **k))
    planner = TPPlanner(graph, profile)
    for budget, plain in zip(budgets, fresh):
        choice = planner.choose(**kw, budget=budget, step=step)
        assert dict(choice.tp_plan) == dict(plain.tp_plan)
        assert [s.objective for s in choice.statuses] == [s.objective for s in plain.statuses]
    assert len({frozenset(c.tp_plan.items()) for c in fresh}) > 1  # the limits bind: one answer must not do for all
    assert read.count(None) == 1 and read.count("layers.0") >= len(budgets)  # the outside nodes' once, not per budget


def test_step_keys_that_charge_alike_solve_the_ilp_with_the_term_once(graph):
    """ZeRO-2's step over pp = 1 and pp = 2 reads other process groups (step keys apart) that charge each split alike:
    TPPlanner solves a block's ILP with the term once per its term's seconds, not per step key; ZeRO-3's term, apart
    in its seconds, is solved again. Every choice is a fresh planner's."""
    profile, kw = _profile(), dict(dp=2, tp=2, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=1)
    planner, solved = TPPlanner(graph, profile), []
    for pp, zero in ((1, 2), (2, 2), (1, 3)):
        plan = Plan(devices=4 * pp, dp=2, tp=2, pp=pp, micro_batch_size=1, num_microbatches=8, zero_stage=zero)
        step = ParamStepPrice(plan, profile, CostModel(graph, profile).dp_terms)
        before = planner.solves
        choice, fresh = planner.choose(**kw, step=step), TPPlanner(graph, profile).choose(**kw, step=step)
        solved.append(planner.solves - before)
        assert dict(choice.tp_plan) == dict(fresh.tp_plan)
        assert [s.objective for s in choice.statuses] == [s.objective for s in fresh.statuses]
    assert solved[0] > 3 and solved[1] == 0 and solved[2] > 0, solved  # 3 ILPs without the term, then with it
