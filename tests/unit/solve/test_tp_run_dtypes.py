"""The TP ILP chooses splits at the prices the plan is charged (solve/tp_plan.py, cost/tp/collectives.py).

Under bf16 autocast the residual stream stays fp32, so a norm output's gradient is reduced (and under sequence
parallelism the norm output gathered) in 4-byte elements: the ILP, given the plan's dtype policy, prices each message
in its tensor's run dtype as CostModel does, so its objective is the final price of the splits it chose. Policies
that price a block alike share one solve (the answer is kept on the prices' fingerprint), and the search asks one
ILP per ZeRO stage of a group, in the stage's dtype policy (FSDP2's cast weights move the stream to bf16).
"""

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.mlp_lm import traced_mlp_lm

from autoplan.cost import CostModel, ParamStepPrice
from autoplan.cost.blocks import block_structure, summarise
from autoplan.cost.compute.dtypes import DtypePolicy, dtype_policy
from autoplan.solve.candidates import SearchOptions, _dp_fields
from autoplan.solve.search import Search
from autoplan.solve.space import EXACT
from autoplan.solve.tp_plan import TPPlanner
from autoplan.trace import trace
from autoplan.types.plan import Plan

BATCH, SEQ, DIM, VOCAB = 2, 1024, 1024, 1024
CHOICE = dict(tp=2, pp=1, precision="bf16", micro_batch_size=BATCH)


@pytest.fixture(scope="module")
def graph():
    return traced_mlp_lm(batch=BATCH, seq=SEQ, dim=DIM, vocab=VOCAB)


def _final_block_s(graph, profile, plan: Plan) -> float:
    """Block 0's seconds as CostModel charges ``plan`` (forward, backward and their TP messages)."""
    ctx, layer = CostModel(graph, profile).tp_context(plan), graph.layers[0]
    block = summarise(graph, block_structure(graph, layer), layer=layer, tp_plan=plan.tp_plan, ctx=ctx)
    return block.fwd_s + block.bwd_s + block.tp_fwd_s + block.tp_bwd_s


@pytest.mark.parametrize("dp, zero", [(1, 0), (2, 3)])
def test_the_ilp_objective_is_the_final_price_of_its_splits(graph, dp, zero):
    """Without sequence parallelism: under it the ILP and CostModel part by one term whatever the dtypes (an fp32
    plan too), which this change leaves as it was."""
    sp = False
    profile = dataclasses.replace(synthetic_profile(intra_busbw_bytes_per_s=230e9), backend="nccl")
    fields = dict(devices=2 * dp, dp=dp, tp=2, pp=1, micro_batch_size=BATCH, num_microbatches=1, precision="bf16")
    plan = Plan(**fields, sequence_parallel=sp, zero_stage=zero)
    policy = dtype_policy(plan, backend=profile.backend)
    choice = TPPlanner(graph, profile).choose(dp=dp, sequence_parallel=sp, **CHOICE, dtypes=policy)
    assert choice.tp_plan["blocks.0.up"] == "colwise"  # messages to price
    charged = _final_block_s(graph, profile, dataclasses.replace(plan, tp_plan=dict(choice.tp_plan)))
    assert choice.statuses[1].objective == pytest.approx(charged, rel=1e-9)  # [0]: the nodes outside the blocks
    precision_bytes = TPPlanner(graph, profile).choose(dp=dp, sequence_parallel=sp, **CHOICE)
    assert precision_bytes.statuses[1].objective < charged  # the fp32 stream's messages priced at 2 bytes


class Mlp(nn.Module):
    """Linears and a gelu only: no op on autocast's fp32 lists, so CPU and CUDA autocast give every node one dtype."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16)) for _ in "ab"])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_policies_that_price_a_block_alike_share_its_solve():
    x = torch.randn(BATCH, SEQ, 16)
    mlp = trace(Mlp(), (x,), loss_fn=lambda out, t: F.mse_loss(out, t), target=torch.randn(BATCH, SEQ, 16))
    profile = synthetic_profile(intra_busbw_bytes_per_s=230e9)
    planner, solves = TPPlanner(mlp, profile), []
    for device, cast in (("cpu", False), ("cuda", False), ("cpu", True)):
        before = planner.solves
        policy = DtypePolicy(low="bfloat16", cast_params=cast, device=device)
        choice = planner.choose(dp=1, sequence_parallel=False, **CHOICE, dtypes=policy)
        fresh = TPPlanner(mlp, profile).choose(dp=1, sequence_parallel=False, **CHOICE, dtypes=policy)
        assert dict(choice.tp_plan) == dict(fresh.tp_plan)
        assert [s.objective for s in choice.statuses] == [s.objective for s in fresh.statuses]
        solves.append(planner.solves - before)
    # the nodes outside the layers and each layer; CUDA's fp32 list names no op here: nothing solved again; cast
    # inputs move the first layer's input gradient (and the outside nodes), the second layer's prices stay; of the two
    # blocks priced anew, one hands HiGHS a model it ran before (apart only in what the model does not read), which
    # HiGHS's memo runs once (solve/linear.py solve; tests/unit/solve/test_ilp_model_memo.py)
    assert solves == [3, 0, 1]


def test_the_search_asks_one_ilp_per_zero_stage_in_its_dtype_policy():
    """Each priced member's tp_plan is the one its own dtype policy and its ZeRO stage's step term choose (the
    stage's exact sync: Search.step_price): on a GPT of a 32,000-word vocabulary at tp = 2 with SP, the fp32 stream
    of ZeRO-0/1 makes the word embedding's reduce-scatter dear enough that the policy alone replicates it at 4
    samples a micro-batch; its 32.8M parameters' dp sync and optimizer step, which the step term adds, keep it
    rowwise, as FSDP2's bf16 stream (ZeRO-2/3) does."""
    gpt = synthetic_gpt(layers=2, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8)
    profile = synthetic_profile(memory_bytes=24 * 2**30)
    options = SearchOptions(devices=4, batch_size=8, fixes={"tp": 2, "sp": True, "precision": "bf16"}, keep=100)
    search = Search(gpt, profile, options)
    priced = [c.plan for c in search.run().candidates if c.plan is not None]
    objectives = [status.objective for status in search.tp_planner.statuses()]
    embedding = {(plan.micro_batch_size, plan.zero_stage >= 2): set() for plan in priced}
    for plan in priced:
        policy = dtype_policy(plan, backend=profile.backend)
        kw = dict(dp=plan.dp, sequence_parallel=True, micro_batch_size=plan.micro_batch_size)  # unfused: no pin
        kw.update(cp=plan.cp, cp_variant=plan.cp_variant)
        exact = Plan.unchecked(**{**plan.__dict__, **_dp_fields(plan.zero_stage, EXACT)})
        step = ParamStepPrice(exact, profile, search.cost_model.dp_terms)
        fresh = TPPlanner(gpt, profile).choose(**{**CHOICE, **kw}, dtypes=policy, step=step)
        assert dict(plan.tp_plan) == dict(fresh.tp_plan), plan
        for status in fresh.statuses:  # the search solved these very prices (a policy of the wrong dtypes does not)
            assert any(o == pytest.approx(status.objective, rel=1e-12) for o in objectives), plan
        embedding[plan.micro_batch_size, plan.zero_stage >= 2].add(plan.tp_plan["wte"])
        alone = TPPlanner(gpt, profile).choose(**{**CHOICE, **kw}, dtypes=policy)
        if plan.micro_batch_size == 4 and plan.zero_stage < 2:
            assert alone.tp_plan["wte"] == "replicate"
    assert embedding[4, False] == {"rowwise"} and embedding[4, True] == {"rowwise"}
