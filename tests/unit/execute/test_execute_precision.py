"""Executor pieces added for low precision, meta-device models and faults, without a process
group: the precision policy, the sharded grad scaler, the norm-relative verify measure, the
same-policy reference, meta materialisation and the launcher's failure message."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from autoplan.errors import ModelFileError
from autoplan.execute.grad_scaler import ShardedGradScaler
from autoplan.execute.job.verify import Difference, reference_step, step_table, tensor_difference, verdict
from autoplan.execute.materialize import materialize, uninitialisable
from autoplan.execute.precision import policy_for
from autoplan.jobs.launcher import _clean, failure_message
from autoplan.types.plan import Plan


def test_policy_follows_how_dp_is_realised():
    assert policy_for(precision="bf16", dp_mode="fsdp").cast_params
    assert not policy_for(precision="bf16", dp_mode="ddp").cast_params
    assert not policy_for(precision="fp32", dp_mode="fsdp").cast_params
    assert policy_for(precision="fp16", dp_mode="allreduce").scales_loss


def _param(grad: list[float]) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(len(grad)))
    p.grad = torch.tensor(grad)
    return p


def test_scaler_unscales_skips_on_overflow_and_adapts_the_scale():
    scaler = ShardedGradScaler(device=torch.device("cpu"), init_scale=8.0, growth_interval=2)
    assert float(scaler.scale_loss(torch.tensor(0.5))) == 4.0
    p = _param([8.0, -16.0])
    assert scaler.unscale_([p]) is False and p.grad.tolist() == [1.0, -2.0]
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 16.0  # grown after growth_interval clean steps
    assert scaler.unscale_([_param([1.0, float("inf")])]) is True
    scaler.update(True)
    assert scaler.scale == 8.0 and scaler.skipped_steps == 1


def test_fp16_loss_scaling_keeps_gradients_that_underflow_unscaled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    plan = Plan(devices=2, dp=2, tp=1, pp=1, zero_stage=2, precision="fp16", micro_batch_size=2, num_microbatches=1)
    x = (torch.randn(4, 8),)
    tiny = lambda out, _: out.float().mean() * 1e-6  # noqa: E731  gradients ~1e-8: fp16 subnormals, a few bits left
    _, unscaled = reference_step(
        model=copy.deepcopy(model), plan=plan, inputs=x, target=None, loss_fn=tiny, loss_scale=1.0
    )
    _, scaled = reference_step(model=copy.deepcopy(model), plan=plan, inputs=x, target=None, loss_fn=tiny)
    exact = plan.__class__(**{**plan.to_dict(), "precision": "fp32", "zero_stage": 0})
    _, truth = reference_step(model=copy.deepcopy(model), plan=exact, inputs=x, target=None, loss_fn=tiny)
    assert tensor_difference(name="w", grad=unscaled["0.weight"], ref=truth["0.weight"], floor=0.0).relative > 0.1
    assert tensor_difference(name="w", grad=scaled["0.weight"], ref=truth["0.weight"], floor=0.0).relative < 5e-3


def test_reference_under_fsdp_policy_casts_parameters_and_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    plan = Plan(devices=2, dp=2, tp=1, pp=1, zero_stage=3, precision="bf16", micro_batch_size=1, num_microbatches=2)
    _, grads = reference_step(
        model=model, plan=plan, inputs=(torch.randn(4, 4),), target=None, loss_fn=lambda o, _: o.float().pow(2).mean()
    )
    assert model[0].weight.dtype == torch.bfloat16 and all(g.dtype == torch.float32 for g in grads.values())


def test_norm_relative_error_is_not_dominated_by_near_zero_elements():
    ref = torch.tensor([1.0, -2.0, 1e-9])
    grad = ref + torch.tensor([1e-6, 0.0, 1e-8])  # 10x off on the near-zero element
    assert tensor_difference(name="g", grad=grad, ref=ref, floor=0.0).relative < 1e-5
    zero = tensor_difference(name="k_bias", grad=torch.full((3,), 1e-9), ref=torch.zeros(3), floor=1e-4)
    assert zero.relative < 1e-4  # a mathematically-zero gradient is judged against the floor
    assert Difference("x", float("nan"), 1.0).relative == float("inf")
    bf16 = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    assert not verdict(diffs=[Difference("x", 4e-2, 1.0)], plan=bf16)[0]


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.emb = nn.Embedding(8, 4)
        self.head.weight = self.emb.weight

    def reset_parameters(self):  # a parent's own init must win over the children's defaults
        nn.init.constant_(self.inner.weight, 0.5)


def test_materialize_initialises_meta_models_reproducibly_and_keeps_ties():
    with torch.device("meta"):
        a, b = Scaled(), Scaled()
    torch.manual_seed(3)
    materialize(a, device=torch.device("cpu"))
    torch.manual_seed(3)
    materialize(b, device=torch.device("cpu"))
    assert a.head.weight is a.emb.weight and not a.inner.weight.is_meta
    assert torch.equal(a.inner.weight, torch.full((4, 4), 0.5))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


class Opaque(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.register_buffer("table", torch.arange(4.0))


def test_materialize_names_what_it_cannot_initialise():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), Opaque())
    assert uninitialisable(model) == ["1.scale", "1.table"]
    with pytest.raises(ModelFileError, match=r"1\.scale, 1\.table.*reset_parameters"):
        materialize(model, device=torch.device("cpu"))
    plain = nn.Linear(2, 2)
    assert materialize(plain, device=torch.device("cpu")) is plain


def test_failure_message_puts_the_cause_before_peers_that_lost_their_connection():
    text = failure_message(
        reasons={
            0: (1, "RuntimeError: Connection closed by peer [127.0.0.1]:1"),
            1: (-6, _clean("[enforce fail at /x/pair.cc:456] Received data size doesn't match")),
        },
        nprocs=2,
    )
    assert text.startswith("rank 1 failed (killed by SIGABRT): Received data size") and text.endswith(
        "; rank 0 then lost its connection; stopped all 2 ranks."
    )
    assert "127.0.0.1" not in text  # the peers' gloo message is noise once the cause is named
    alone = failure_message(reasons={0: (1, "RuntimeError: Connection closed by peer [127.0.0.1]:1")}, nprocs=2)
    assert alone.startswith("rank 0 failed (exit code 1): RuntimeError: Connection closed by peer")
    alike = failure_message(reasons={0: (1, "PlanError: no split"), 1: (1, "PlanError: no split")}, nprocs=2)
    assert alike == "ranks 0, 1 failed (exit code 1): PlanError: no split; stopped all 2 ranks."


_LSTM_UNDER_AUTOCAST = """
import torch
from autoplan.execute import precision
torch.manual_seed(0)
lstm, x = torch.nn.LSTM(8, 12, num_layers=2, batch_first=True), torch.randn(2, 5, 8)
want = lstm(x)[0]
for name in ("bf16", "fp16"):
    with precision.autocast(precision.policy_for(precision=name, dp_mode="ddp"), device_type="cpu"):
        out = lstm(x)[0]
    out.float().sum().backward()
    assert torch.allclose(out.float(), want, atol=2e-2), name
print("oneDNN", torch.backends.mkldnn.enabled)
"""


def test_an_lstm_runs_under_low_precision_autocast_where_onednn_has_no_kernel_for_it():
    """Capped at AVX2, oneDNN has no bf16 (nor fp16) LSTM kernel, yet torch hands it autocast's
    low-precision RNN layer: the run failed to create the primitive (an AVX2-only CI machine)."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", _LSTM_UNDER_AUTOCAST], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "oneDNN False"


def test_the_verify_table_lists_the_tensor_nearest_its_own_tolerance_first():
    """A gradient at 1.02x its bf16 tolerance failed the step, and the table, ranked by the relative difference
    alone, listed only weights-after-the-step (0.07x of theirs) and left it out."""
    bf16 = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    weights = [Difference(f"w{i} (weight after the step)", 3.5e-2, 1.0) for i in range(5)]
    gradient = Difference("fc.weight", 3.06e-2, 1.0)
    passed, lines = step_table(diffs=[*weights, gradient], plan=bf16, rows=2)
    assert not passed
    assert "fc.weight" in lines[1] and "(tolerance 0.03)" in lines[1]


def test_a_batch_norm_gets_its_weight_in_its_statistics_dtype_and_updates_them_in_place():
    """FSDP2's cast_params leaves bf16 weights beside fp32 running statistics (every BatchNorm plan under ZeRO-2/3 in
    bf16 stopped); both call forms (F.batch_norm's order and the ATen binding's weight-first one) run mixed, in bf16,
    and keep updating the fp32 buffers themselves."""
    from autoplan.execute.precision import NormParamsLikeStatistics

    x = torch.randn(8, 3, dtype=torch.bfloat16)
    weight, bias = torch.ones(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)
    mean, var = torch.zeros(3), torch.ones(3)
    with NormParamsLikeStatistics():
        assert torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=True).dtype == torch.bfloat16
        after_first = mean.clone()
        assert torch.batch_norm(x, weight, bias, mean, var, True, 0.1, 1e-5, False).dtype == torch.bfloat16
    assert mean.dtype == torch.float32 and after_first.abs().sum() > 0 and not torch.equal(mean, after_first)
