"""Compiled blocks: element-wise ops priced as fused regions (autoplan/cost/compute/fusion.py), the
same in CostModel, ops.csv, the block ILP and the search's bounds, and pinned with --fix compile."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel, price_block
from autoplan.cost.blocks import block_structure, summarise
from autoplan.cost.bounds import Bounds
from autoplan.cost.compute.fusion import fused_moved_bytes, fused_ops, regions
from autoplan.cost.compute.roofline import memory_time_s
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.volumes import predict
from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import ops_csv
from autoplan.solve.pins import parse_fixes
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.plan import Plan


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=2, hidden=256, heads=4, seq=128, batch=4)


def _plan(**changes) -> Plan:
    base = dict(devices=2, dp=1, tp=2, pp=1, micro_batch_size=2, num_microbatches=2, precision="bf16")
    return Plan(**{**base, **changes})


def test_a_gpt_block_has_four_convex_regions(graph):
    """ln_1 | residual add + ln_2 | gelu | residual add: the second add is not joined with the first
    although it reads it, since the MLP's GEMMs lie on a path between them (a kernel cannot consume
    what a GEMM makes of its own output)."""
    mine = [[graph.node(n).op for n in r] for r in regions(graph) if graph.node(r[0]).layer == graph.layers[0]]
    assert mine == [["norm"], ["elementwise", "norm"], ["elementwise"], ["elementwise"]]
    assert all(graph.node(n).layer is not None for r in regions(graph) for n in r)  # outside nodes stay eager


def test_a_region_reads_its_inputs_once_and_writes_what_leaves_it(graph):
    """The residual add + ln_2 region: it reads the attention output and the block input, writes the
    add (the second residual reads it) and ln_2 (the MLP reads it); the add's output that ln_2 reads
    stays in the kernel. Forward bytes I + O, backward O + 2 I."""
    add, norm = next(r for r in regions(graph) if graph.node(r[0]).layer == graph.layers[0] and len(r) == 2)
    ops = fused_ops(graph)
    inputs = [graph.node(p) for p in ops[add].reads + ops[norm].reads]
    size = {n.name: n.output_bytes / 2 for n in (*inputs, graph.node(add), graph.node(norm))}  # bf16 of fp32
    read, written = sum(size[n.name] for n in inputs), size[add] + size[norm]
    assert len(inputs) == 2 and ops[norm].reads == () and ops[add].writes and ops[norm].writes
    moved = {
        backward: sum(
            fused_moved_bytes(graph, graph.node(n), ops[n], precision="bf16", gpu=True, backward=backward)
            for n in (add, norm)
        )
        for backward in (False, True)
    }
    assert moved == {False: pytest.approx(read + written), True: pytest.approx(written + 2 * read)}
    assert [ops[add].launches, ops[norm].launches] == [True, False]


def test_compiled_blocks_cost_less_and_every_consumer_prices_them_alike(graph):
    """compile=True lowers the compute price by the bytes and launches fusion saves; ops.csv, the block
    ILP's objective and CostModel's block summaries agree under it (op_costs.py: one price per op)."""
    profile = synthetic_profile()
    plan = _plan(compile=True, tp_plan=default_tp_plan(graph, 2, sequence_parallel=False))
    model = CostModel(graph, profile)
    eager, fused = model.estimate(replace(plan, compile=False)), model.estimate(plan)
    assert fused.compute_s < eager.compute_s and fused.tp_comm_s == eager.tp_comm_s
    rows = list(csv.DictReader(io.StringIO(ops_csv(graph, profile, plan))))
    assert plan.num_microbatches * sum(float(r["compute_s"]) for r in rows) == pytest.approx(fused.compute_s, rel=1e-9)
    ctx = model.tp_context(plan)
    assert ctx.fused
    layer = graph.layers[0]
    problem = price_block(graph, layer, ctx=ctx, forward_repeats=1, activation_factor=ctx.batch_fraction)
    splits = {v: plan.tp_plan.get(graph.node(v).module, "replicate") for v in problem.params}
    block = summarise(graph, block_structure(graph, layer), layer=layer, tp_plan=plan.tp_plan, ctx=ctx)
    time_s, _memory = problem.evaluate(splits)
    assert time_s == pytest.approx(block.fwd_s + block.bwd_s + block.tp_fwd_s + block.tp_bwd_s, rel=1e-9)


def test_the_saving_is_the_bytes_fusion_keeps_in_the_kernel(graph):
    """On a profile without launch overheads, the eager minus the fused price of one block is the
    memory time of the bytes its regions no longer move (nothing else changes)."""
    profile = synthetic_profile()
    assert profile.device.op_overhead is None
    plan = _plan(tp=1, devices=1)
    model = CostModel(graph, profile)
    layer = graph.layers[0]
    blocks = {
        fused: summarise(
            graph,
            block_structure(graph, layer),
            layer=layer,
            tp_plan={},
            ctx=replace(model.tp_context(plan), fused=fused, dtypes=None),  # every activation in bf16, as below
        )
        for fused in (False, True)
    }
    ops = fused_ops(graph)
    saved_bytes = 0.0
    for name in (n for r in regions(graph) if graph.node(r[0]).layer == layer for n in r):
        node = graph.node(name)
        reads = sum(graph.node(p).output_bytes / 2 for p in graph.adjacency()[0][name])
        eager = {False: reads + node.output_bytes / 2, True: node.output_bytes / 2 + 2 * reads}
        for backward in (False, True):
            fused = fused_moved_bytes(graph, node, ops[name], precision="bf16", gpu=True, backward=backward)
            saved_bytes += (eager[backward] - fused) * plan.micro_batch_size / graph.batch_size
    eager_s = blocks[False].fwd_s + blocks[False].bwd_s
    fused_s = blocks[True].fwd_s + blocks[True].bwd_s
    assert saved_bytes > 0
    assert eager_s - fused_s == pytest.approx(memory_time_s(profile, saved_bytes), rel=1e-6)


def test_the_bound_stays_below_a_compiled_plan(graph):
    """The search's compute floor with fused=True is below a compiled plan's price (the eager floor
    need not be: fusion makes element-wise ops cheaper than eager)."""
    profile = synthetic_profile()
    model = CostModel(graph, profile)
    plan = _plan(tp=1, devices=1, compile=True)
    bounds = Bounds(graph, profile, StageCosts(graph, profile, model))
    floor = bounds.compute_min_s(tp=1, precision="bf16", mbs=2, fused=True)
    assert floor * plan.num_microbatches <= model.estimate(plan).compute_s * (1 + 1e-9)
    assert floor < bounds.compute_min_s(tp=1, precision="bf16", mbs=2)


def test_fix_compile_pins_the_plan_and_prices_it_fused(graph):
    assert parse_fixes("compile=on,tp=1") == {"compile": True, "tp": 1}
    with pytest.raises(PlanError, match="compile=maybe is not valid; expected on or off"):
        parse_fixes("compile=maybe")
    profile = synthetic_profile()
    result = plan_graph(graph, devices=2, profile=profile, batch_size=4, fix="compile=on,dp=2")
    assert result.best.compile and all(c.plan.compile for c in result.candidates if c.plan is not None)
    assert result.best_cost.step_time_s == pytest.approx(CostModel(graph, profile).estimate(result.best).step_time_s)
    eager = plan_graph(graph, devices=2, profile=profile, batch_size=4, fix="dp=2")
    assert not eager.best.compile and eager.best_cost.compute_s > result.best_cost.compute_s


def test_the_audit_predicts_one_set_of_regions_per_group_of_identical_blocks(graph):
    profile = replace(synthetic_profile(), devices_per_node=8)
    model = CostModel(graph, profile)
    per_block = sum(1 for r in regions(graph) if graph.node(r[0]).layer == graph.layers[0])
    compiled = predict(model, _plan(tp=1, dp=2, compile=True))
    assert [p.fused_regions for p in compiled] == [per_block] and per_block == 4
    assert [p.fused_regions for p in predict(model, _plan(tp=1, dp=2))] == [0]
