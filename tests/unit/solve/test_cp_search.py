"""Context parallelism in the search: the degrees the sequence allows, the variants the backend runs, the pins."""

import math
from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel
from autoplan.errors import PlanError
from autoplan.solve import space
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.context_parallel import check_cp_pins, cp_sequence
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.types.plan import Plan


@pytest.fixture(scope="module")
def tiny():
    return synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)


def _masked(graph):
    """``graph`` with its first attention taking an explicit mask, which cp cannot split."""
    node = next(n for n in graph.nodes if n.op == "attention")
    node.attrs = {**node.attrs, "has_mask": True}
    return graph


def test_pins_parse_and_refuse_in_one_sentence():
    assert parse_fixes("cp=4,cp_variant=ring") == {"cp": 4, "cp_variant": "ring"}
    for bad in ("cp=0", "cp_variant=striped"):
        with pytest.raises(PlanError) as info:
            parse_fixes(bad)
        assert "not valid" in str(info.value) and "\n" not in str(info.value)


def test_degrees_split_the_devices_over_cp_where_the_sequence_allows():
    kw = dict(devices=16, per_node=8, layers=4, batch=16, fixes={}, eps=(1, 2))
    degrees = space.degree_options(cp_seq_len=24, **kw)  # 2cp | 24: cp in 1, 2, 4 (not 8, 16)
    assert {d.cp for d in degrees} == {1, 2, 4}
    assert all(d.dp * d.cp * d.tp * d.pp == 16 for d in degrees)
    assert all(d.ep == 1 for d in degrees if d.cp > 1)  # cp does not compose with ep
    without = space.degree_options(**kw)  # cp_seq_len 0: the model refuses cp
    assert without == [d for d in degrees if d.cp == 1]  # and the cp = 1 space is the old one, in its order
    pinned = space.degree_options(cp_seq_len=24, **{**kw, "fixes": {"cp": 2}})
    assert pinned and {d.cp for d in pinned} == {2}


def test_cp_is_searched_only_where_the_model_and_backend_allow_it(tiny):
    nccl, gloo = synthetic_profile(), replace(synthetic_profile(), backend="gloo")
    assert cp_sequence(tiny, nccl, {}) == 128
    assert cp_sequence(_masked(synthetic_gpt(layers=1, seq=128, batch=2)), nccl, {}) == 0
    assert cp_sequence(tiny, nccl, {"cp": 1}) == cp_sequence(tiny, nccl, {"ep": 2}) == 0
    result = plan_graph(tiny, devices=8, profile=gloo, batch_size=16, fix="cp=2")
    evaluated = [c for c in result.candidates if c.status == "evaluated"]
    assert evaluated and {(c.plan.cp, c.plan.cp_variant) for c in evaluated} == {(2, "allgather")}
    assert all(c.plan.dp * c.plan.cp * c.plan.tp * c.plan.pp == 8 for c in evaluated)
    variants = {c.config["cp_variant"] for c in plan_graph(tiny, devices=8, profile=nccl, batch_size=16).candidates}
    assert variants == {"allgather", "ring"}


def test_a_micro_batch_sharing_a_factor_with_cp_is_left_to_dp_unless_pinned(tiny):
    """(dp, cp, mbs) with g = gcd(cp, mbs) > 1 runs what (dp g, cp / g, mbs / g) runs with more K,V: not searched."""
    kw = dict(devices=8, profile=synthetic_profile(), batch_size=16)
    free = [c.config for c in plan_graph(tiny, **kw).candidates if c.config["cp"] > 1]
    assert free and all(math.gcd(c["mbs"], c["cp"]) == 1 for c in free)
    pinned = [c.config for c in plan_graph(tiny, fix="cp=2", **kw).candidates]  # dp * 2 is then no option
    assert {c["mbs"] for c in pinned} == {1, 2, 4, 8, 16}  # every divisor of the batch per dp rank


@pytest.mark.parametrize("variant", ["allgather", "ring"])
def test_the_folded_plan_is_priced_no_worse(tiny, variant):
    """The rule's premise, held against CostModel: (dp 4, cp 2, mbs 1) costs no more time or memory than
    (dp 2, cp 4, mbs 2), whose gcd(cp, mbs) = 2 the search leaves out."""
    model = CostModel(tiny, synthetic_profile())
    kw = dict(devices=8, tp=1, pp=1, num_microbatches=4, cp_variant=variant, precision="bf16", recompute="none")
    folded = model.estimate(Plan(dp=4, cp=2, micro_batch_size=1, **kw))
    left_out = model.estimate(Plan(dp=2, cp=4, micro_batch_size=2, **kw))
    assert folded.step_time_s <= left_out.step_time_s and folded.peak_memory_bytes <= left_out.peak_memory_bytes
    assert folded.cp_comm_s <= left_out.cp_comm_s


def test_sequence_parallelism_under_cp_shards_the_local_sequence():
    """tp shards a cp rank's S / cp tokens: at S = 96, cp = 8 leaves 12, which tp = 8 does not divide (96 it does)."""
    graph = synthetic_gpt(layers=2, hidden=256, heads=8, vocab=8000, seq=96, batch=8)
    kw = dict(devices=64, profile=synthetic_profile(), batch_size=8)
    assert any(c.config["sp"] is True for c in plan_graph(graph, fix="cp=1,tp=8", **kw).candidates)
    assert all(c.config["sp"] is False for c in plan_graph(graph, fix="cp=8,tp=8", **kw).candidates)
    assert any(c.config["sp"] is True for c in plan_graph(graph, fix="cp=4,tp=8", **kw).candidates)  # 24 a rank


@pytest.mark.parametrize(
    ("graph", "pins", "backend", "words"),
    [
        (None, {"cp": 2}, "nccl", "explicit mask"),
        ("tiny", {"cp": 3}, "nccl", "2*cp = 6 equal chunks"),
        ("tiny", {"cp": 2, "ep": 2}, "nccl", "does not compose with expert parallelism"),
        ("tiny", {"cp_variant": "ring"}, "gloo", "which runs allgather"),
    ],
)
def test_a_pin_the_model_sequence_or_backend_refuses_is_one_sentence(tiny, graph, pins, backend, words):
    graph = tiny if graph else _masked(synthetic_gpt(layers=1, seq=128, batch=2))
    with pytest.raises(PlanError) as info:
        check_cp_pins(graph, replace(synthetic_profile(), backend=backend), pins)
    assert words in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(PlanError):  # and the search raises it before searching
        plan_graph(graph, devices=8, profile=replace(synthetic_profile(), backend=backend), batch_size=8, fix=pins)


def test_bounds_of_cp_plans_stay_below_their_price_and_count_every_blocks_gathers(tiny):
    """Bound (2) never exceeds the priced objective of any plan, cp plans included; under cp a ZeRO-3
    plan's bound counts each block's exposed weight gather (a block computes 1/cp of the tokens but
    gathers all its weights), not only the first block's."""
    search = Search(tiny, synthetic_profile(), SearchOptions(devices=8, batch_size=8, keep=10**6))
    priced = [c for c in search.run().candidates if c.cost is not None and c.status == "evaluated"]
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)
    zero3 = [c.lower_bound / c.objective for c in priced if c.plan.cp > 1 and c.plan.zero_stage == 3 and c.plan.pp == 1]
    assert len(zero3) > 10 and min(zero3) > 0.9  # 0.82 when the bound counted the first block's gather alone


def _root_masked_graph():
    """A model whose root makes a sliding-window mask [B, 1, S, S] and hands it to every block (Hugging Face's
    habit), traced at 64 tokens."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from autoplan.trace import trace

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(64, 192), nn.Linear(64, 64)

        def forward(self, x, mask):
            q, k, v = self.qkv(x).view(*x.shape[:2], 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return x + self.out(y.transpose(1, 2).reshape(x.shape))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.layers = nn.Embedding(100, 64), nn.ModuleList(Block() for _ in range(4))

        def forward(self, idx):
            pos = torch.arange(idx.size(1), device=idx.device)
            mask = ((pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < 16))[None, None]
            x = self.emb(idx)
            for layer in self.layers:
                x = layer(x, mask.expand(idx.size(0), 1, -1, -1))
            return x

    return trace(Model(), (torch.zeros(2, 64, dtype=torch.long),))


def test_a_model_masked_before_its_blocks_is_split_by_the_variants_that_apply_masks_outside_a_pipeline():
    """cp runs such a mask through autoplan's all-gather (Ulysses on gloo), never torch's ring, and not beside a
    pipeline, whose exported stages cannot meet the whole mask with a shard's queries; pins say so in one sentence."""
    graph, nccl = _root_masked_graph(), synthetic_profile()
    assert cp_sequence(graph, nccl, {}) == 64
    candidates = plan_graph(graph, devices=8, profile=nccl, batch_size=16).candidates
    split = [c for c in candidates if c.config["cp"] > 1]
    assert split and {c.config["cp_variant"] for c in split} == {"allgather"}
    assert all(c.config["pp"] == 1 for c in split) and any(c.config["pp"] > 1 for c in candidates)
    for pins, words in (({"cp": 2, "pp": 2}, "pin one of them to 1"), ({"cp_variant": "ring"}, "pin one that does")):
        with pytest.raises(PlanError) as info:
            check_cp_pins(graph, nccl, pins)
        assert "explicit mask" in str(info.value) and words in str(info.value) and "\n" not in str(info.value)
