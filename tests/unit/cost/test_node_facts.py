"""cost/node_terms.py ``node_facts`` and summarise's ``BlockFacts`` read no batch fraction nor expert placement, so
cost/summaries.py keeps them per block, splits and the rest of the context (``TPContext.unbatched_key``). Each field
that key leaves out is changed in turn (the micro-batch, the placement, and both), under tp with split linears and
sequence parallelism, under cp, and under fusion: every block's and outside part's summary from one cost model that
kept them must equal a fresh cost model's, and a block priced again at another micro-batch computes no node facts,
loss bytes or held parameters."""

from __future__ import annotations

import pytest
from synthetic import synthetic_profile
from synthetic.graphs import synthetic_gpt
from synthetic.moe import mixtral_graph

from autoplan.cost import blocks as blocks_module
from autoplan.cost import node_terms as node_terms_module
from autoplan.cost.model import CostModel
from autoplan.cost.tp.default import default_tp_plan
from autoplan.types.plan import Plan

pytest.importorskip("transformers")

#: (tp, sequence parallel, cp, ep, compile, precision, ZeRO stage): the contexts each micro-batch is priced in
SETTINGS = [
    (1, False, 1, 2, False, "bf16", 0),
    (2, True, 1, 1, False, "bf16", 0),
    (2, False, 1, 1, False, "bf16", 0),
    (1, False, 2, 1, False, "bf16", 0),
    (1, False, 1, 4, True, "bf16", 0),
    (1, False, 1, 2, False, "fp32", 0),
    (1, False, 1, 2, False, "bf16", 3),  # FSDP casts the weights: other run dtypes (compute/dtypes.py)
]


@pytest.fixture(scope="module")
def graph():
    return mixtral_graph()


def _plan(graph, setting: tuple, *, micro_batch_size: int, ep: int | None = None) -> Plan:
    tp, sp, cp, own_ep, compile, precision, zero_stage = setting
    tp_plan = default_tp_plan(graph, tp, sequence_parallel=sp) if tp > 1 else {}
    return Plan(
        devices=8, dp=8 // (tp * cp), tp=tp, cp=cp, pp=1, ep=ep or own_ep, micro_batch_size=micro_batch_size,
        num_microbatches=1, precision=precision, sequence_parallel=sp, compile=compile, tp_plan=tp_plan,
        zero_stage=zero_stage,
    )  # fmt: skip


def _summaries(model: CostModel, plan: Plan) -> list:
    ctx = model.tp_context(plan)
    out = [model.block_summary(layer, plan.tp_plan, ctx) for layer in model.graph.layers]
    return out + [model.block_summary(None, plan.tp_plan, ctx, part) for part in ("pre", "post")]


@pytest.mark.parametrize("dense", [False, True])
def test_facts_kept_at_one_micro_batch_serve_every_other(graph, dense):
    """On the MoE graph and on a dense GPT whose attention is causal (its cp share, cost/cp/exposed.py)."""
    graph = synthetic_gpt() if dense else graph
    model = CostModel(graph, synthetic_profile())  # one model keeps the facts of every setting: none may serve another
    for setting in SETTINGS:
        tp, _, cp, ep = setting[:4]
        ep = 1 if dense else ep
        for mbs, other_ep in ((4, ep), (2, ep), (1, ep), (2, 2 * ep if cp == 1 and tp == 1 else ep)):
            plan = _plan(graph, setting, micro_batch_size=mbs, ep=other_ep)
            fresh = CostModel(graph, model.profile)
            assert _summaries(model, plan) == _summaries(fresh, plan), (setting, mbs, other_ep)


@pytest.mark.parametrize("setting", SETTINGS)
def test_another_micro_batch_computes_no_facts(graph, setting, monkeypatch):
    model = CostModel(graph, synthetic_profile())
    _summaries(model, _plan(graph, setting, micro_batch_size=4))
    calls = []
    for module, name in (
        (node_terms_module, "fp8_linear"),
        (blocks_module, "loss_grad_bytes"),
        (blocks_module, "_params"),
    ):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    again = _summaries(model, _plan(graph, setting, micro_batch_size=2))
    assert calls == []
    monkeypatch.undo()
    assert again == _summaries(CostModel(graph, model.profile), _plan(graph, setting, micro_batch_size=2))
