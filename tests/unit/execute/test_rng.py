"""--verify's control of randomness without a process group (autoplan/execute/rng.py): dropout
off wherever a model calls it, how many steps verify compares, and the CLI's refusal of fewer."""

from __future__ import annotations

import random

import numpy
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.cli import main
from autoplan.execute import rng
from autoplan.execute.job.reference import verify_steps
from autoplan.types.plan import Plan

transformers = pytest.importorskip("transformers")


def _t5() -> nn.Module:
    """HF T5 at its default dropout_rate (0.1), built from a config."""
    config = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).train()


def _loss(model: nn.Module) -> torch.Tensor:
    ids = torch.arange(16).reshape(2, 8) % 64
    return model(input_ids=ids, labels=ids).loss.detach()


def test_t5_attention_dropout_is_not_a_module_and_dropout_off_finds_it():
    """Why --verify failed on T5 and passed on BERT: T5's attention keeps its rate as a float and
    calls F.dropout itself, so zeroing every nn.Dropout's p (what --verify did) leaves it on;
    BERT's attention reads an nn.Dropout module's p. Under dropout_off the model is deterministic,
    and computes what eval mode does."""
    model = _t5()
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    assert not torch.equal(_loss(model), _loss(model))  # still random: the attention's functional dropout
    with rng.dropout_off() as mode:
        first, second = _loss(model), _loss(model)
    assert torch.equal(first, second) and torch.equal(first, _loss(model.eval()))
    assert mode.dropped == 2 * 3  # per forward: encoder self, decoder self and cross attention
    assert "dropout off in the run and in the reference (6 calls" in rng.describe(mode)


def test_dropout_off_turns_stochastic_depth_off_by_its_modules_names():
    """Stochastic depth draws with torch.rand (Hugging Face, timm) or bernoulli_ (torchvision), which no function
    mode can tell from a draw the model needs: Swin at its default drop_path_rate failed --verify. Its modules,
    named ``*DropPath`` (``drop_prob``) or ``StochasticDepth`` (``p``), are set to rate 0 for good, in the model
    that is then copied for the reference; a module of another name, or a rate that is not a number, is left."""

    class SwinDropPath(nn.Module):  # Hugging Face's name; timm's is DropPath
        def __init__(self):
            super().__init__()
            self.drop_prob = 0.2

        def forward(self, x):
            if not self.training or self.drop_prob == 0:
                return x
            return x * (1 - self.drop_prob + torch.rand(x.shape[0], 1)).floor() / (1 - self.drop_prob)

    class StochasticDepth(nn.Module):  # torchvision's
        def __init__(self):
            super().__init__()
            self.p, self.mode = 0.3, "row"

    class Gate(nn.Module):  # not stochastic depth: its drop_prob is the model's business
        def __init__(self):
            super().__init__()
            self.drop_prob = 0.5

    model = nn.Sequential(SwinDropPath(), nn.Sequential(StochasticDepth(), Gate()))
    x = torch.ones(64, 4)
    assert not torch.equal(model[0](x), x)
    mode = rng.dropout_off(model)
    assert (model[0].drop_prob, model[1][0].p, model[1][1].drop_prob) == (0.0, 0.0, 0.5)
    assert torch.equal(model[0](x), x) and mode.depth_off == 2
    assert "and stochastic depth (2 modules' rate set to 0)" in rng.describe(mode)
    assert rng.dropout_off(model).depth_off == 0  # already off


def test_dropout_off_zeroes_attention_dropout_and_counts_other_draws():
    q = torch.randn(1, 2, 4, 8)
    with rng.dropout_off() as mode:
        out = F.scaled_dot_product_attention(q, q, q, None, 0.9)
        kw = F.scaled_dot_product_attention(q, q, q, dropout_p=0.9)
        _ = torch.rand(3), torch.empty(3).bernoulli_(0.5)
        _ = numpy.random.rand(2), random.random()  # host generators: Hugging Face Wav2Vec2's SpecAugment masks
        same = F.dropout(q, p=0.5, training=False)
        # what a pipeline stage's exported graph calls (docs/executor.md: the stages are torch.export graphs)
        graph_dropout = torch.ops.aten.dropout.default(q, 0.5, True)
        graph_attention = torch.ops.aten.scaled_dot_product_attention.default(q, q, q, None, 0.9)
    plain = F.scaled_dot_product_attention(q, q, q)
    assert torch.equal(out, plain) and torch.equal(kw, plain) and same is q
    assert graph_dropout is q and torch.equal(graph_attention, plain)
    assert mode.dropped == 4  # two attentions, two graph ops; a call that would not drop (training=False) is not
    assert "rand x1" in rng.describe(mode) and "bernoulli_ x1" in rng.describe(mode)
    assert "numpy.random.rand x1" in rng.describe(mode) and "random.random x1" in rng.describe(mode)
    assert numpy.random.rand.__name__ == "rand"  # put back on exit


def test_dropout_off_turns_the_dropout_between_stacked_recurrent_layers_off():
    """nn.LSTM, nn.GRU and nn.RNN hand their inter-layer dropout to torch._VF (a stage's graph: aten.lstm.input),
    which no dropout function sees: --verify of a 2-layer LSTM at dropout 0.2 failed (64%) saying no dropout ran."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4)
    for kind in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN):
        layer, plain = kind(4, 6, num_layers=2, dropout=0.5, batch_first=True), kind(4, 6, num_layers=2)
        plain.load_state_dict(layer.state_dict())
        plain.batch_first = True
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, [5, 4, 2], batch_first=True)
        with rng.dropout_off() as mode:
            out, again, seq = layer(x)[0], layer(x)[0], layer(packed)[0]
        assert torch.equal(out, again) and torch.allclose(out, plain(x)[0]), kind
        assert torch.allclose(seq.data, plain(packed)[0].data) and mode.dropped == 3, kind
    gru = torch.nn.GRU(4, 6, num_layers=2, dropout=0.5, batch_first=True)
    h0, call = torch.zeros(2, 3, 6), (True, 2, 0.5, True, False, True)  # has_biases, layers, dropout, train, ...
    with rng.dropout_off() as mode:  # as a pipeline stage's exported graph calls it
        graph = torch.ops.aten.gru.input(x, h0, gru._flat_weights, *call)[0]
    assert torch.allclose(graph, gru.eval()(x)[0]) and mode.dropped == 1
    one = torch.nn.LSTM(4, 6, num_layers=1)
    with rng.dropout_off() as mode:
        one(x)
    assert mode.dropped == 0  # one layer: nothing between layers to drop


def _plan(**kw) -> Plan:
    return Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, **kw)


def test_verify_steps_cover_each_options_steady_state():
    assert verify_steps(_plan()) == 2  # DDP's rebuilt buckets, the optimizer's second step
    assert verify_steps(_plan(grad_compression="powersgd", powersgd_rank=2)) == 3  # compressed from step 2


def test_run_refuses_verify_with_fewer_steps_in_one_sentence(tmp_path, capsys):
    from pathlib import Path

    plan = _plan(grad_compression="powersgd", powersgd_rank=2).save(tmp_path / "plan.json")
    gpt = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
    code = main(["run", str(gpt), "--plan", str(plan), "--steps", "2", "--verify", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--verify compares the first 3 steps of this plan (PowerSGD compresses from step 2 on)" in err[0]
    assert not (tmp_path / "run").exists()


def _compressed(mean: torch.Tensor, rank: int) -> torch.Tensor:
    """``P P^T mean`` for an orthonormal ``P`` of ``rank`` random directions: what a PowerSGD step
    returns for any start (the subspace is the run's; verify checks the rest)."""
    basis, _ = torch.linalg.qr(torch.randn(mean.shape[0], rank, dtype=torch.float64))
    return basis @ (basis.T @ mean)


def test_powersgd_reference_accepts_the_compressed_mean_and_nothing_else():
    """The reference's PowerSGD check (autoplan/execute/job/reference.py) on synthetic gradients of
    two ranks: the projection of the error-fed dp mean passes at fp32's tolerance; twice it (no
    division by dp), the projection of one rank's gradient, or the uncompressed mean is O(1) off;
    and the error feedback carries what the step left out into the next."""
    from autoplan.execute.job.reference import powersgd_expected

    torch.manual_seed(0)
    ranks = [torch.randn(32, 24, dtype=torch.float64) for _ in range(2)]
    mean = (ranks[0] + ranks[1]) / 2
    bias = torch.randn(32, dtype=torch.float64)

    def error(run: torch.Tensor, feedback=None) -> float:
        grads, kept = {"w": mean.float(), "b": bias.float()}, dict(feedback or {})
        want = powersgd_expected(grads, run={"w": run.float(), "b": bias.float()}, feedback=kept, rank=2,
                                 min_compression_rate=2)["w"]  # fmt: skip
        return float((run.float() - want).norm() / want.norm())

    right = _compressed(mean, 2)
    assert error(right) < 1e-5
    assert error(2 * right) > 0.5 and error(_compressed(ranks[0], 2)) > 0.3 and error(mean) > 0.3
    feedback: dict = {}
    powersgd_expected({"w": mean.float()}, run={"w": right.float()}, feedback=feedback, rank=2, min_compression_rate=2)
    assert torch.allclose(feedback["w"], mean - right, atol=1e-5)  # what the step left out, carried
    fed = _compressed(mean + feedback["w"], 2)  # the next step compresses the gradient plus it
    assert error(fed, feedback) < 1e-5 and error(_compressed(mean, 2), feedback) > 0.1


def test_each_pipeline_stage_draws_from_a_stream_of_its_own():
    """rng.seed_step: the same stream on every dp/tp rank of a stage, another per stage and per
    step (Megatron seeds stages 100 apart), and apart from the stream the step's batch came from."""

    def draws(**kw) -> torch.Tensor:
        rng.seed_step(**kw)
        return torch.rand(8)

    first = draws(seed=0, step=3, pp_rank=0)
    assert torch.equal(first, draws(seed=0, step=3, pp_rank=0))
    assert not torch.equal(first, draws(seed=0, step=3, pp_rank=1))
    assert not torch.equal(first, draws(seed=0, step=4, pp_rank=0))
    torch.manual_seed(0 + 1 + 3)  # the runner's batch seed for step 3
    assert not torch.equal(first, torch.rand(8))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_checkpointed_forward_reruns_with_dropout_off_inside_the_backward(use_reentrant):
    """torch's autograd engine runs the backward without the forward's torch function modes: a checkpoint's
    re-run there dropped out again (a CheckpointError, or other gradients) unless dropout_off re-enters."""
    from torch.utils import checkpoint as ckpt

    frame_init, backward = ckpt._CheckpointFrame.__init__, ckpt.CheckpointFunction.__dict__["backward"]

    def block(x):
        return F.dropout(x, 0.5, training=True).sin()

    x = torch.randn(64, requires_grad=True)
    mode = rng.dropout_off()
    with mode:
        ckpt.checkpoint(block, x, use_reentrant=use_reentrant).sum().backward()
    assert torch.equal(x.grad, x.detach().cos())  # d/dx sin(x): no mask, in the forward or the re-run
    assert mode.dropped == 2  # the forward's call and the re-run's
    assert ckpt._CheckpointFrame.__init__ is frame_init and ckpt.CheckpointFunction.__dict__["backward"] is backward
