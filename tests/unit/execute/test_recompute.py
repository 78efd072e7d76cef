"""Selective recomputation keeps what the cost model prices as kept (autoplan/types/saved_ops.py):
every kernel a kept node runs as is saved by the executor's policy, and a grouped expert GEMM is
not re-run in the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils.checkpoint import CheckpointPolicy

from autoplan.execute.job.meters import LiveBytes, MatmulFlops
from autoplan.execute.recompute import _policy, apply_recompute

aten = torch.ops.aten
KEPT = [
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten._grouped_mm.default,
    aten._scaled_mm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten.convolution.default,
]
RERUN = [aten.gelu.default, aten._softmax.default, aten.native_layer_norm.default, aten.abs.default, aten.amax.default]


@pytest.mark.parametrize("op", KEPT + RERUN, ids=str)
def test_the_policy_keeps_the_kernels_of_kept_nodes_and_reruns_the_rest(op):
    expected = CheckpointPolicy.MUST_SAVE if op in KEPT else CheckpointPolicy.PREFER_RECOMPUTE
    assert _policy(None, op) == expected


class _Block(nn.Module):
    """A router and Hugging Face Mixtral's experts, run as grouped GEMMs (``aten._grouped_mm``)."""

    def __init__(self, experts: nn.Module):
        super().__init__()
        self.router, self.experts = nn.Linear(16, 4, bias=False), experts

    def forward(self, x):
        weights, index = torch.softmax(self.router(x), dim=-1).topk(2, dim=-1)
        return self.experts(torch.nn.functional.gelu(x), index, weights)


def _backward_flops(mode: str) -> tuple[float, float]:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    config = MixtralConfig(hidden_size=16, intermediate_size=32, num_local_experts=4)
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    model = nn.Sequential(_Block(MixtralExperts(config)))
    for weight in model.parameters():
        nn.init.normal_(weight, std=0.2)
    apply_recompute(module=model, blocks=["0"], mode=mode)
    meter = MatmulFlops()
    with meter:
        model(torch.randn(24, 16)).square().sum().backward()
    return tuple(meter.flops["matmul"])


def test_selective_recomputation_does_not_rerun_grouped_expert_gemms():
    pytest.importorskip("transformers")
    plain, selective, full = _backward_flops("none"), _backward_flops("selective"), _backward_flops("full")
    assert selective == plain  # the kept GEMMs are looked up, not re-run
    assert full[1] > plain[1]  # full recomputation does re-run them: the meter sees grouped GEMMs


def _stack(blocks: int) -> nn.Module:
    model = nn.Module()
    model.h = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(blocks))
    return model


def _plan(**kw):
    from autoplan.types.plan import Plan

    kw.setdefault("pp", 1)
    return Plan(devices=kw["pp"], dp=1, tp=1, micro_batch_size=1, num_microbatches=2, **kw)


def test_a_budget_checkpoints_the_first_k_blocks_of_each_chunk():
    from autoplan.execute.recompute import expects_recompute, recompute_targets

    blocks = [f"h.{i}" for i in range(4)]
    one_chunk = recompute_targets(plan=_plan(recompute="full", recompute_blocks=[3]), blocks=blocks)
    assert one_chunk == ["h.0", "h.1", "h.2"]
    assert recompute_targets(plan=_plan(recompute="full"), blocks=blocks) == blocks  # [] is every block
    staged = _plan(pp=2, recompute="selective", recompute_blocks=[1, 0], stages=[blocks[:2], blocks[2:]])
    targets = recompute_targets(plan=staged, blocks=blocks)
    assert targets == ["h.0"]
    assert expects_recompute(plan=staged, targets=targets, chunks=[0])
    assert not expects_recompute(plan=staged, targets=targets, chunks=[1])  # stage 1's budget is 0
    model = _stack(4)
    assert apply_recompute(module=model, blocks=one_chunk, mode="full") == 3
    wrapped = [hasattr(block.forward, "__wrapped__") for block in model.h]
    assert wrapped == [True, True, True, False]


def test_a_budget_re_runs_only_its_blocks_forward_in_the_backward():
    torch.manual_seed(0)
    runs = {}
    for k in (0, 2, 4):
        model = _stack(4)
        calls = []
        for index, block in enumerate(model.h):
            block[0].register_forward_hook(lambda *_args, index=index: calls.append(index))
        plan = _plan(recompute="full", recompute_blocks=[k]) if k else _plan(recompute="none")
        from autoplan.execute.recompute import recompute_targets

        apply_recompute(
            module=model, blocks=recompute_targets(plan=plan, blocks=[f"h.{i}" for i in range(4)]), mode=plan.recompute
        )
        x = torch.randn(3, 8)
        for block in model.h:
            x = block(x)
        calls.clear()
        x.sum().backward()
        runs[k] = sorted(calls)
    assert runs == {0: [], 2: [0, 1], 4: [0, 1, 2, 3]}


class _Mlp(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize("split_backward", [False, True])
def test_a_split_backward_reruns_a_selective_block_in_b_and_again_in_w(split_backward):
    """Zero-bubble and V schedules run B (input gradients) and W (weight gradients) as two autograd passes, and
    torch re-runs a checkpointed block in each. Under the selective policy torch's cache gives each kept output to
    one re-run ("Trying to backward an extra time" at W); with ``split_backward`` the kept outputs stay for W's,
    whose weight gradients equal the block's without recomputation, with no kept matmul run again."""
    torch.manual_seed(0)
    plain = nn.Sequential(_Mlp())
    checkpointed = nn.Sequential(_Mlp())
    checkpointed.load_state_dict(plain.state_dict())
    apply_recompute(module=checkpointed, blocks=["0"], mode="selective", split_backward=split_backward)
    x = torch.randn(4, 8)
    grads = []
    for model in (plain, checkpointed):
        inp = x.clone().requires_grad_()
        out = model(inp).square().sum()
        (dx,) = torch.autograd.grad(out, inp, retain_graph=True)  # B
        if model is checkpointed and not split_backward:
            with pytest.raises(RuntimeError, match="backward an extra time"):
                torch.autograd.grad(out, list(model.parameters()))
            return
        with MatmulFlops() as flops:
            dw = torch.autograd.grad(out, list(model.parameters()))  # W
        grads.append((dx, dw, flops.flops["matmul"][1]))
    (dx, dw, plain_flops), (dx_c, dw_c, flops_c) = grads
    torch.testing.assert_close(dx_c, dx)
    for a, b in zip(dw_c, dw):
        torch.testing.assert_close(a, b)
    assert flops_c == plain_flops  # W's re-run took the kept matmul outputs, ran no matmul of its own


def _normed_stack(blocks: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.LayerNorm(64), _Mlp(64, 256)) for _ in range(blocks)])


def _split_step(mode: str) -> tuple[int, list[torch.Tensor]]:
    """One B and one W (torch's stage_backward_input / _weight, as the executor's split schedules run them):
    the peak live bytes from the forward on, and the gradients."""
    model = _normed_stack()
    apply_recompute(module=model, blocks=["0", "1"], mode=mode, split_backward=True)
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with LiveBytes([*model.parameters(), x]) as live:
        (dx,), groups = stage_backward_input([model(x).square().sum()], None, [x], model.parameters())
        stage_backward_weight(model.parameters(), groups)
        del groups
    return live.peak - live.start, [dx, *(p.grad for p in model.parameters())]


def test_a_split_backward_drops_each_reruns_leftovers_when_its_pass_ends():
    """torch keeps a re-run's tensors that its pass never unpacks (W's in B, B's in W) until the graph is freed;
    the executor drops them when the pass ends. Full recomputation then peaks no higher than none (it held
    1.26x none's peak before: B's leftovers beside W's whole second re-run), nor does selective (1.09x before: each
    re-run's graph hung on the kept outputs, the next test), and every gradient is unchanged."""
    none_peak, reference = _split_step("none")
    for mode in ("full", "selective"):
        peak, grads = _split_step(mode)
        for a, b in zip(grads, reference):
            torch.testing.assert_close(a, b)
        assert peak <= none_peak, mode


def _b_peak(mode: str, blocks: int) -> tuple[int, list[torch.Tensor]]:
    """The peak bytes B (torch's stage_backward_input) holds beyond what the forward left, and every gradient
    after W (stage_backward_weight)."""
    model = _normed_stack(blocks)
    apply_recompute(module=model, blocks=[str(i) for i in range(blocks)], mode=mode, split_backward=True)
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with LiveBytes([*model.parameters(), x]) as live:
        loss = model(x).square().sum()
        live.peak = forward = live.current  # B's peak from here
        (dx,), groups = stage_backward_input([loss], None, [x], model.parameters())
    stage_backward_weight(model.parameters(), groups)
    return live.peak - forward, [dx, *(p.grad for p in model.parameters())]


def test_a_split_backwards_b_holds_one_selective_blocks_rerun_whatever_the_block_count():
    """Selective recomputation's B holds one block's re-run beyond what B holds without recomputation (the
    gradients W reads, one set per block), as the cost model prices (cost/stages.py ``peak_block_bytes``). SAC
    hands each re-run the kept outputs, and autograd hung the re-run's graph on them; kept for W's re-run, each
    held its B re-run's tensors (the GELU's output, a linear's input) to the step's end: 0.33, 0.66, 1.3 MB above
    no recomputation's B on 1, 2, 4 blocks, where it is now 0.07 MB on each (execute/recompute.py
    ``_KeptForEachRerun``). Every gradient equals no recomputation's."""
    above = {}
    for blocks in (1, 2, 4):
        none_peak, reference = _b_peak("none", blocks)
        peak, grads = _b_peak("selective", blocks)
        for a, b in zip(grads, reference, strict=True):
            torch.testing.assert_close(a, b)
        above[blocks] = peak - none_peak
    assert 0 < above[4] <= above[1] and above[2] <= above[1], above


class _RunningNormed(nn.Module):
    """A block whose forward updates buffers it then reads: a spectral norm's power-iteration vectors and a running
    mean it subtracts (tests/odd_models/buffer_updates.py's two kinds), and BatchNorm's statistics."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.linear = torch.nn.utils.spectral_norm(nn.Linear(dim, dim))
        self.norm = nn.BatchNorm1d(dim)
        self.register_buffer("mean", torch.zeros(dim))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.5).add_(0.5 * x.mean(0))
        return torch.tanh(self.norm(self.linear(x - self.mean)))


@pytest.mark.parametrize("mode, split_backward", [("full", False), ("selective", False), ("full", True)])
def test_a_rerun_sees_the_buffers_its_forward_found_and_leaves_them_as_the_forward_did(mode, split_backward):
    """Two forwards (two micro-batches), then their backwards: each block's re-run reads the buffers as its own
    forward found them (else the spectral norm's weight is rebuilt from the vectors the next forward left), and
    after the backwards every buffer is where the forwards left it, as without recomputation."""
    torch.manual_seed(0)
    plain = nn.Sequential(_RunningNormed(), _RunningNormed())
    checkpointed = nn.Sequential(_RunningNormed(), _RunningNormed())
    checkpointed.load_state_dict(plain.state_dict())
    apply_recompute(module=checkpointed, blocks=["0", "1"], mode=mode, split_backward=split_backward)
    batches = [torch.randn(6, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    results = []
    for model in (plain, checkpointed):
        losses = [model(x).square().sum() for x in batches]
        for loss in losses:
            loss.backward()
        results.append(([p.grad for p in model.parameters()], dict(model.named_buffers())))
    (grads, buffers), (grads_c, buffers_c) = results
    for a, b in zip(grads_c, grads):
        torch.testing.assert_close(a, b)
    for name, buffer in buffers.items():
        torch.testing.assert_close(buffers_c[name], buffer)


def test_selective_recomputation_of_a_recurrent_block_gives_the_plain_gradients():
    """A GRU and an LSTM under selective recomputation: their CPU kernels update in place the matmul outputs SAC
    kept, so the re-run read altered gates (GRU gradients 25-36% off); nothing inside them is kept now."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.GRU(12, 12, batch_first=True), nn.LSTM(12, 12, batch_first=True))
    checkpointed = nn.Sequential(nn.GRU(12, 12, batch_first=True), nn.LSTM(12, 12, batch_first=True))
    checkpointed.load_state_dict(plain.state_dict())
    apply_recompute(module=checkpointed, blocks=["0", "1"], mode="selective")
    x = torch.randn(4, 6, 12, generator=torch.Generator().manual_seed(1))
    grads = []
    for model in (plain, checkpointed):
        h, _ = model[0](x)
        out, _ = model[1](h)
        out.square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a)


class _InplaceBlock(nn.Module):
    """A Linear whose output an activation overwrites: as a module flag (HF Swinv2's MLP) or a functional call."""

    def __init__(self, functional: bool):
        super().__init__()
        self.up, self.act, self.down, self.functional = (
            nn.Linear(8, 16),
            nn.ReLU(inplace=True),
            nn.Linear(16, 8),
            functional,
        )

    def forward(self, x):
        h = self.up(x)
        h = torch.relu_(h) if self.functional else self.act(h)
        return x + self.down(h)


def test_selective_recomputation_turns_in_place_modules_off_and_names_an_in_place_call_in_one_sentence():
    """SAC keeps the Linear's output by reference: ReLU(inplace=True) over it stopped the backward ("Tensor cached
    during selective activation checkpoint has been mutated"). The block's modules now write anew (same values);
    a functional in-place call is refused in one sentence."""
    from autoplan.errors import PlanError
    from autoplan.execute.recompute import out_of_place
    from autoplan.execute.trainer import _explained
    from autoplan.types.plan import Plan

    torch.manual_seed(0)
    model, x = nn.Sequential(_InplaceBlock(False), _InplaceBlock(False)), torch.randn(4, 8)
    reference = nn.Sequential(*(_InplaceBlock(False) for _ in range(2)))
    reference.load_state_dict(model.state_dict())
    assert out_of_place(module=model, blocks=["1"]) == 1 and model[0].act.inplace and not model[1].act.inplace
    assert out_of_place(module=model, blocks=["0", "1"]) == 1
    apply_recompute(module=model, blocks=["0", "1"], mode="selective")
    model(x).sum().backward()
    reference(x).sum().backward()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(mine.grad, theirs.grad)
    calls = nn.Sequential(_InplaceBlock(True))
    apply_recompute(module=calls, blocks=["0"], mode="selective")
    with pytest.raises(PlanError, match="the model changes one in place .* plan recompute=full or none"):
        with _explained(
            Plan(devices=1, dp=1, tp=1, pp=1, micro_batch_size=4, num_microbatches=1, recompute="selective")
        ):
            calls(x).sum().backward()
