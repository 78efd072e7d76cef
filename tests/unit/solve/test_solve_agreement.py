"""The planner charges what CostModel charges, on graphs from the real tracer.

examples/gpt.py (nanoGPT: fused [q | k | v], SDPA, dropout 0.1) and examples/gpt_megatron.py
(Megatron's head-interleaved fused qkv, explicit-matmul attention, dropout with its 1-byte mask
on a GPU profile) are traced once each; for several tp plans the intra-op ILP's objective and
memory row, and the per-op rows of ops.csv, must sum to CostModel's own numbers.
"""

import csv
import io
import itertools
from pathlib import Path

import pytest

from autoplan.cost import CostModel, price_block
from autoplan.cost.blocks import block_structure, summarise
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.splits import TPContext
from autoplan.profile import load_profile
from autoplan.solve.outputs import ops_csv
from autoplan.solve.tp_plan import TPPlanner
from autoplan.trace import trace_model_file
from autoplan.types import Plan

ROOT = Path(__file__).resolve().parents[3]
BATCH = 4
SIZES = {
    "gpt": ("AUTOPLAN_GPT", dict(N_LAYER=2, N_EMBD=128, N_HEAD=4, BLOCK_SIZE=128, VOCAB_SIZE=512, DROPOUT=0.1)),
    "gpt_megatron": ("AUTOPLAN_GPTM", dict(N_LAYER=2, N_EMBD=128, N_HEAD=4, SEQ_LEN=128, VOCAB_SIZE=512)),
}


@pytest.fixture(scope="module")
def graphs():
    found = {}
    with pytest.MonkeyPatch.context() as mp:
        for example, (prefix, sizes) in SIZES.items():
            for name, value in sizes.items():
                mp.setenv(f"{prefix}_{name}", str(value))
            found[example] = trace_model_file(ROOT / "examples" / f"{example}.py", BATCH)
    return found


@pytest.fixture(scope="module")
def a100():
    return load_profile(ROOT / "profiles" / "dgx-a100.yaml")


def _ctx(profile, tp, sp, mbs=2):
    return TPContext(
        profile=profile,
        tp=tp,
        group=mesh_groups(profile, dp=1, tp=tp, pp=1)["tp"],
        sequence_parallel=sp,
        precision="bf16",
        batch_fraction=mbs / BATCH,
    )


@pytest.mark.parametrize("example", list(SIZES))
@pytest.mark.parametrize("tp, sp", [(2, False), (4, True)])
def test_ilp_objective_and_memory_row_equal_the_cost_models_block(graphs, a100, example, tp, sp):
    graph = graphs[example]
    layer = graph.layers[0]
    ctx = _ctx(a100, tp, sp)
    problem = price_block(graph, layer, ctx=ctx, forward_repeats=2, activation_factor=ctx.batch_fraction)
    structure = block_structure(graph, layer)
    combos = list(itertools.product(*(problem.legal[v] for v in problem.params)))
    assert len(combos) > 8
    for combo in combos[:: max(1, len(combos) // 40)]:
        splits = dict(zip(problem.params, combo))
        if not problem.respects_ties(splits):
            continue
        tp_plan = {graph.node(v).module: s for v, s in splits.items()}
        block = summarise(graph, structure, layer=layer, tp_plan=tp_plan, ctx=ctx)
        time_s, memory = problem.evaluate(splits)
        assert time_s == pytest.approx(2 * block.fwd_s + block.bwd_s + 2 * block.tp_fwd_s + block.tp_bwd_s, rel=1e-9)
        assert memory == pytest.approx(block.saved_bytes, rel=1e-9)


def _plans(graph, profile):
    """Megatron's default plan, the ILP's plan and (under SP) both again, at tp=2 on one node."""
    planner = TPPlanner(graph, profile)
    for sp in (False, True):
        chosen = planner.choose(dp=1, tp=2, pp=1, sequence_parallel=sp, precision="bf16", micro_batch_size=2).tp_plan
        for tp_plan in (default_tp_plan(graph, 2, sequence_parallel=sp), chosen):
            yield Plan(
                devices=2,
                dp=1,
                tp=2,
                pp=1,
                micro_batch_size=2,
                num_microbatches=BATCH // 2,
                precision="bf16",
                sequence_parallel=sp,
                stages=[list(graph.layers)],
                tp_plan=tp_plan,
            )


@pytest.mark.parametrize("example", list(SIZES))
def test_ops_csv_sums_to_what_cost_model_charges(graphs, a100, example):
    graph = graphs[example]
    for plan in _plans(graph, a100):
        rows = list(csv.DictReader(io.StringIO(ops_csv(graph, a100, plan))))
        cost = CostModel(graph, a100).estimate(plan)
        m = plan.num_microbatches  # pp = 1: every op runs on the one stage, m times
        assert m * sum(float(r["compute_s"]) for r in rows) == pytest.approx(cost.compute_s, rel=1e-9)
        assert m * sum(float(r["comm_s"]) for r in rows) == pytest.approx(cost.tp_comm_s, rel=1e-9)
        # 1F1B with pp = 1 keeps one micro-batch in flight; ops.csv rounds each op to whole bytes
        assert sum(int(r["activation_bytes"]) for r in rows) == pytest.approx(cost.activations_bytes, abs=len(rows))
