"""FP8 in one process: the device rule, eligibility per local shard, conversion, the fp8 and
low-precision-reduction policies, and `autoplan run` refusing an fp8 plan on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from autoplan.errors import PlanError
from autoplan.execute import float8, precision
from autoplan.types.plan import Plan

ROOT = Path(__file__).resolve().parents[3]
CPU_SENTENCE = (
    "plan precision fp8 needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+: H100, H200, L40S, B200); "
    "this run is on CPU: re-plan with --fix precision=bf16."
)


def _plan(**kw) -> Plan:
    kw = {"devices": 2, "dp": 2, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_microbatches": 1, **kw}
    return Plan(**kw)


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.delenv(float8.EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_fp8_plan_is_refused_on_cpu_in_one_sentence(cpu_only):
    with pytest.raises(PlanError) as info:
        float8.check_runs_here(_plan(precision="fp8"))
    assert str(info.value) == CPU_SENTENCE
    float8.check_runs_here(_plan(precision="bf16"))  # other precisions have no device rule here


def test_emulation_lets_a_cpu_run_through(cpu_only, monkeypatch):
    monkeypatch.setenv(float8.EMULATE_ENV, "1")
    float8.check_runs_here(_plan(precision="fp8"))


def test_gpu_without_fp8_tensor_cores_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(PlanError, match=r"this run is on NVIDIA A100-SXM4-80GB \(compute capability 8\.0\): re-plan"):
        float8.check_runs_here(_plan(precision="fp8"))


def test_missing_torchao_says_pip_install(cpu_only, monkeypatch):
    import importlib.util

    monkeypatch.setenv(float8.EMULATE_ENV, "1")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(PlanError, match="pip install torchao"):
        float8.check_runs_here(_plan(precision="fp8"))


def test_eligibility_is_per_local_shard():
    linear = nn.Linear(64, 96)
    assert float8.eligible(module=linear)
    assert float8.eligible(module=linear, split="colwise", tp=2)  # 96 / 2 = 48
    assert not float8.eligible(module=linear, split="colwise", tp=4)  # 96 / 4 = 24
    assert not float8.eligible(module=linear, split="rowwise", tp=8)  # 64 / 8 = 8
    assert not float8.eligible(module=nn.Linear(64, 10)) and not float8.eligible(module=nn.Embedding(32, 32))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.up, self.down, self.odd = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 10)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, idx):
        x = self.emb(idx)
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(x) + self.odd(x).sum(-1, keepdim=True)


def test_convert_swaps_eligible_linears_keeps_ties_and_stays_close_to_bf16():
    torch.manual_seed(0)
    model, plain = Tiny(), Tiny()
    plain.load_state_dict(model.state_dict())
    plan = _plan(precision="fp8")
    fqns = float8.eligible_fqns(model, plan)
    assert fqns == ["up", "down", "head"]
    assert float8.convert_linears(model, fqns) == fqns
    assert [float8.is_float8(getattr(model, n)) for n in ("up", "down", "head", "odd")] == [True, True, True, False]
    assert model.head.weight is model.emb.weight
    assert float8.eligible_fqns(model, plan) == []  # converting again changes nothing
    idx = torch.randint(0, 64, (4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = model(idx), plain(idx)
    out.float().sum().backward()
    assert model.up.weight.grad is not None
    rel = float((out.float() - ref.float()).detach().norm() / ref.float().norm())
    assert 0 < rel < 0.1  # e4m3 inputs and weights (unit roundoff 2^-4), not bf16's 2^-8


def test_fp8_policy_computes_in_bf16_and_reduce_dtype_is_free():
    fp8 = precision.policy_for(precision="fp8", dp_mode="ddp")
    assert fp8.compute_dtype == torch.bfloat16 and fp8.low and not fp8.scales_loss and not fp8.cast_params
    assert precision.policy_for(precision="fp8", dp_mode="fsdp").cast_params
    fp32 = precision.policy_for(precision="fp32", dp_mode="fsdp", reduce_dtype="bf16")
    mp = precision.mp_policy(fp32)
    assert mp.param_dtype is None and mp.reduce_dtype == torch.bfloat16


def test_cli_refuses_fp8_on_cpu_before_any_rank(tmp_path):
    import os

    plan = _plan(precision="fp8", micro_batch_size=1, num_microbatches=1).save(tmp_path / "plan.json")
    env = {k: v for k, v in os.environ.items() if k not in (float8.EMULATE_ENV, "RANK", "WORLD_SIZE")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    args = [str(ROOT / "examples/gpt.py"), "--plan", str(plan), "--steps", "1", "--out", str(tmp_path / "run")]
    result = subprocess.run(
        [sys.executable, "-m", "autoplan.cli", "run", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    assert result.stderr.strip() == f"autoplan: error: {CPU_SENTENCE}"
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
