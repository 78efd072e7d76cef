"""The cost model on graphs from the real tracer (examples/gpt_megatron.py, examples/gpt.py).

examples/gpt_megatron.py computes attention as Megatron-LM did (explicit QK^T, mask, softmax,
dropout, probs @ V), so Korthikanti et al. 2022 eq. (1), sbh(34 + 5as/h), applies in full.
The models are traced in fp32 and priced in bf16: floating tensors halve, the CUDA dropout
mask stays 1 byte per element.
"""

import dataclasses
from pathlib import Path

import pytest

from autoplan.cost import CostModel
from autoplan.cost.compute.roofline import op_time_s
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import mesh_groups
from autoplan.errors import PlanError
from autoplan.profile import load_profile
from autoplan.trace import trace_model_file
from autoplan.types import Plan

ROOT = Path(__file__).resolve().parents[3]
S, H, A, V, BATCH = 256, 256, 4, 1024, 2


def _megatron(monkeypatch, layers):
    for name, value in dict(N_LAYER=layers, N_EMBD=H, N_HEAD=A, SEQ_LEN=S, VOCAB_SIZE=V).items():
        monkeypatch.setenv(f"AUTOPLAN_GPTM_{name}", str(value))
    return trace_model_file(ROOT / "examples" / "gpt_megatron.py", BATCH)


@pytest.fixture(scope="module")
def megatron_graphs():
    with pytest.MonkeyPatch.context() as mp:
        return {layers: _megatron(mp, layers) for layers in (2, 4)}


@pytest.fixture(scope="module")
def a100():
    return load_profile(ROOT / "profiles" / "dgx-a100.yaml")


def _plan(**kw):
    fields = dict(devices=1, dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=BATCH, precision="bf16")
    fields.update(kw)
    fields["devices"] = fields["dp"] * fields["tp"] * fields["pp"]
    return Plan(**fields)


def _per_layer_sbh(graphs, profile, **kw):
    """Per-layer activations in sbh as Megatron-LM runs the block, every activation in 16 bits (autoplan's
    executor runs bf16 under autocast, which keeps the softmax's scores fp32 on CUDA: docs/cost-model.md,
    "Activation dtypes")."""
    kw.setdefault("runtime", "megatron-lm-2022")
    two, four = (CostModel(graphs[n], profile).estimate(_plan(**kw)).activations_bytes for n in (2, 4))
    return (four - two) / 2 / (S * H)


def test_megatron_attention_activations_are_korthikanti_eq1(megatron_graphs, a100):
    # Korthikanti et al. 2022 eq. (1): sbh(34 + 5as/h) with 16-bit activations and 1-byte dropout masks.
    assert _per_layer_sbh(megatron_graphs, a100) == pytest.approx(34 + 5 * A * S / H, rel=0.005)


def test_selective_recompute_keeps_inputs_and_matmul_outputs(megatron_graphs, a100):
    # Op-level selective recomputation (cost/blocks.py) keeps the block input (2), q, k, v (6), the
    # QK^T scores (2as/h: a matmul output, which Korthikanti et al. 2022 section 4.3 would also
    # drop), the attention output (2), the projection (2), fc1 (8) and fc2 (2); full keeps 2 sbh.
    assert _per_layer_sbh(megatron_graphs, a100, recompute="selective") == pytest.approx(22 + 2 * A * S / H, rel=0.005)
    assert _per_layer_sbh(megatron_graphs, a100, recompute="full") == pytest.approx(2, rel=0.005)


def test_dropout_mask_is_one_byte_on_gpu_and_traced_dtype_on_cpu(megatron_graphs, a100):
    # The CPU trace keeps a float noise tensor; CUDA's native_dropout keeps a bool mask. A cpu-gloo
    # profile keeps the traced mask (halved to bf16: 2 bytes): 3 masks per layer, 2 of sbh and 1 of as^2.
    cpu = load_profile(ROOT / "profiles" / "cpu-gloo.yaml")
    extra = _per_layer_sbh(megatron_graphs, cpu) - _per_layer_sbh(megatron_graphs, a100)
    assert extra == pytest.approx(2 + A * S / H, rel=0.01)


def test_s2_score_tensors_are_priced_by_bytes_moved(megatron_graphs, a100):
    # The softmax over b*a*s*s bf16 scores reads and writes them once: memory bound.
    graph = megatron_graphs[2]
    softmax = next(n for n in graph.nodes if n.layer == graph.layers[0] and "softmax" in n.target)
    scores = BATCH * A * S * S * 2
    device = a100.device
    expected = 2 * scores / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    assert op_time_s(softmax, a100, precision="bf16", batch_fraction=1.0, input_bytes=scores) == pytest.approx(expected)
    # Its backward reads dY and the saved output and writes dX.
    assert op_time_s(
        softmax, a100, precision="bf16", batch_fraction=1.0, input_bytes=scores, backward=True
    ) == pytest.approx(1.5 * expected)


def test_unfused_attention_costs_more_than_flash(monkeypatch, megatron_graphs, a100):
    # Same shapes through SDPA (examples/gpt.py, flash-like: no s^2 bytes) are cheaper per block: the
    # unfused block moves the bf16 scores at least 4 times more (mask, softmax, dropout in and out).
    for name, value in dict(N_LAYER=2, N_EMBD=H, N_HEAD=A, BLOCK_SIZE=S, VOCAB_SIZE=V, DROPOUT=0.1).items():
        monkeypatch.setenv(f"AUTOPLAN_GPT_{name}", str(value))
    flash = trace_model_file(ROOT / "examples" / "gpt.py", BATCH)
    per_block = {}
    for key, graph in (("flash", flash), ("megatron", megatron_graphs[2])):
        model = CostModel(graph, a100)
        model.estimate(_plan())
        block = next(v for k, v in model.summaries._cache.items() if k[0] == graph.layers[0])
        per_block[key] = block.fwd_s
    device = a100.device
    one_pass_s = 2 * BATCH * A * S * S * 2 / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    assert per_block["megatron"] - per_block["flash"] > 3 * one_pass_s


def test_transformer_flops_of_traced_gpt_match_narayanan_eq3(monkeypatch, a100):
    # Narayanan et al. SC'21 eq. (3) on the real tracer's nanoGPT (examples/gpt.py): 72 B s l h^2 (1 + s/(6h))
    # for the blocks plus 6 B s h V for the head; full recomputation adds one forward per block (96).
    layers, batch, s, h, v = 2, 4, 128, 256, 512
    for name, value in dict(N_LAYER=layers, N_EMBD=h, N_HEAD=4, BLOCK_SIZE=s, VOCAB_SIZE=v).items():
        monkeypatch.setenv(f"AUTOPLAN_GPT_{name}", str(value))
    graph = trace_model_file(ROOT / "examples" / "gpt.py", batch)
    cost = CostModel(graph, a100).estimate(_plan(dp=4, micro_batch_size=1, num_microbatches=1, recompute="full"))
    blocks = 72 * batch * s * layers * h**2 * (1 + s / (6 * h))
    head = 6 * batch * s * h * v
    assert cost.extra["model_flops"] == pytest.approx(blocks + head, rel=0.02)
    assert cost.extra["hardware_flops"] == pytest.approx(blocks * 96 / 72 + head, rel=0.02)


def test_overlap_grad_reduce_is_a_plan_property(megatron_graphs, a100):
    graph = megatron_graphs[4]
    model = CostModel(graph, a100)
    dp_only, tp_dp = _plan(dp=16, num_microbatches=1), _plan(dp=8, tp=2, num_microbatches=1)
    # dp only: our executor wraps the model in DDP, which overlaps; Megatron 2021-22 did not,
    # and a plan that says so runs the explicit all-reduce after the backward.
    overlapped = model.estimate(dp_only)
    assert overlapped.dp_comm_exposed_s < overlapped.dp_comm_s
    exposed = model.estimate(dataclasses.replace(dp_only, overlap_grad_reduce=False))
    assert exposed.dp_comm_exposed_s == pytest.approx(exposed.dp_comm_s)
    # DDP also broadcasts the model's buffers (this model's causal mask) each step; the explicit all-reduce does not
    group = mesh_groups(a100, dp=16, tp=1, pp=1)["dp"]
    assert graph.buffer_bytes > 0
    assert overlapped.dp_comm_s - exposed.dp_comm_s == pytest.approx(
        collective_time_s(a100, "all_gather", graph.buffer_bytes, group=group)
    )
    # tp > 1: our executor all-reduces after the backward either way
    tp_cost = model.estimate(tp_dp)
    assert tp_cost.dp_comm_exposed_s == pytest.approx(tp_cost.dp_comm_s) and tp_cost.dp_comm_s > 0
    with pytest.raises(PlanError, match="FSDP2"):
        _plan(dp=16, num_microbatches=1, zero_stage=3, overlap_grad_reduce=False)
