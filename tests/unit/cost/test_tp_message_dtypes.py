"""Each tensor-parallel message is priced in the run dtype of the tensor it moves (autoplan/cost/tp/collectives.py).

Under bf16 autocast (the executor's policy without FSDP2) the residual stream stays fp32: the embedding and the
adds are not autocast ops and fp32 + bf16 promotes to fp32, and a norm over it keeps fp32. So a rowwise linear's
partial output is all-reduced in bf16, while the gradient of the norm output the colwise linears read is reduced in
fp32, and under sequence parallelism the norm output is gathered in fp32 (benchmarks/audit.py's tp_bf16 and
fp8_tp_sp families measured exactly that). With FSDP2's cast weights (ZeRO-2/3 over dp > 1) all of it is bf16.
"""

import dataclasses

import pytest
from synthetic import synthetic_profile
from synthetic.mlp_lm import traced_mlp_lm

from autoplan.cost.model import CostModel
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.splits import block_messages, tp_layer_cost
from autoplan.types.plan import Plan

BATCH, SEQ, DIM, VOCAB = 2, 8, 16, 32
TOKENS = BATCH * SEQ


@pytest.fixture(scope="module")
def graph():
    return traced_mlp_lm(batch=BATCH, seq=SEQ, dim=DIM, vocab=VOCAB)


def _block_messages(graph, *, sp: bool, dp: int = 1, backend: str = "gloo", **kw) -> tuple[dict, dict]:
    """Block 0's messages per micro-batch as the cost model prices them for ``plan`` (its TP context) on a
    ``backend`` profile (gloo: CPU autocast, under which RMSNorm keeps its input's dtype)."""
    plan = Plan(devices=2 * dp, dp=dp, tp=2, pp=1, micro_batch_size=BATCH, num_microbatches=1,
                sequence_parallel=sp, **kw)  # fmt: skip
    profile = dataclasses.replace(synthetic_profile(), backend=backend)
    ctx = CostModel(graph, profile).tp_context(plan)
    tp_plan = default_tp_plan(graph, 2, sequence_parallel=sp)
    fwd, bwd = block_messages(graph, graph.layers[0], tp_plan, ctx=ctx)
    return fwd.by_kind, bwd.by_kind


def test_autocast_reduces_the_rowwise_output_in_bf16_and_the_fp32_stream_in_fp32(graph):
    fwd, bwd = _block_messages(graph, sp=False, precision="bf16")
    assert fwd == {"all_reduce": [1, TOKENS * DIM * 2]}  # down's partial output: a linear, bf16
    assert bwd == {"all_reduce": [1, TOKENS * DIM * 4]}  # the norm output's gradient: the fp32 stream


def test_autocast_gathers_the_fp32_stream_under_sequence_parallelism(graph):
    fwd, bwd = _block_messages(graph, sp=True, precision="bf16")
    assert fwd == {"all_gather": [1, TOKENS * DIM * 4], "reduce_scatter": [1, TOKENS * DIM * 2]}
    assert bwd == {"reduce_scatter": [1, TOKENS * DIM * 4], "all_gather": [1, TOKENS * DIM * 2]}


@pytest.mark.parametrize("sp", [False, True])
def test_cast_weights_send_bf16_and_fp32_sends_fp32(graph, sp):
    """FSDP2 casts the weights, so the embedding and the stream are bf16 too: every message at 2 bytes an element,
    half of what the fp32 plan sends; Megatron's runtime (the whole model cast) the same."""
    fp32 = _block_messages(graph, sp=sp, precision="fp32")
    halved = tuple({k: [c, b / 2] for k, (c, b) in side.items()} for side in fp32)
    assert _block_messages(graph, sp=sp, dp=2, zero_stage=3, precision="bf16") == halved
    assert _block_messages(graph, sp=sp, precision="bf16", runtime="megatron") == halved


def test_cuda_autocast_keeps_its_fp32_list_in_fp32_under_cast_weights(graph):
    """On CUDA rms_norm is on autocast's fp32 list (aten/src/ATen/autocast_mode.h): with FSDP2's bf16 weights
    the norm output, and so its gradient's reduction, is still fp32; the rowwise output stays bf16."""
    fwd, bwd = _block_messages(graph, sp=False, dp=2, zero_stage=3, precision="bf16", backend="nccl")
    assert fwd == {"all_reduce": [1, TOKENS * DIM * 2]} and bwd == {"all_reduce": [1, TOKENS * DIM * 4]}


def test_the_priced_seconds_follow_the_dtypes_whatever_was_priced_first():
    """block_terms caches each block's terms on the graph: two plans that differ only in their activation dtypes
    (autoplan's autocast against Megatron's whole-model cast, both bf16) get their own seconds in either order."""
    seconds = {}
    for order in (("autoplan", "megatron"), ("megatron", "autoplan")):
        graph = traced_mlp_lm(batch=BATCH, seq=SEQ, dim=DIM, vocab=VOCAB)
        model = CostModel(graph, dataclasses.replace(synthetic_profile(), backend="gloo"))
        for runtime in order:
            plan = Plan(
                devices=2,
                dp=1,
                tp=2,
                pp=1,
                micro_batch_size=BATCH,
                num_microbatches=1,
                precision="bf16",
                runtime=runtime,
            )
            cost = tp_layer_cost(graph, graph.layers[0], default_tp_plan(graph, 2), ctx=model.tp_context(plan))
            seconds.setdefault(runtime, set()).add(cost.comm_bwd_s)
    assert len(seconds["autoplan"]) == len(seconds["megatron"]) == 1
    assert min(seconds["autoplan"]) > min(seconds["megatron"])  # fp32 gradients of the stream against bf16
