"""`autoplan run` end to end: run folder contents, --verify, and a crashing rank."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from exec_models import SMALL_GPT

from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env_extra: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "autoplan.cli", "run", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)  # fmt: skip


def _verified_gpt(tmp_path: Path, plan: Plan, steps: int, env: dict[str, str], *extra: str) -> tuple[str, dict]:
    """``autoplan run examples/gpt.py`` of ``plan`` for ``steps`` with --verify and ``extra``: it exits 0 and
    PASSED; what it printed, and its summary's verify section."""
    result = _run([str(ROOT / "examples/gpt.py"), "--plan", str(plan.save(tmp_path / "plan.json")), "--steps",
                   str(steps), "--verify", *extra, "--out", str(tmp_path / "run")], env)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
    return result.stdout, json.loads((tmp_path / "run/summary.json").read_text())["verify"]


def test_run_writes_measured_and_summary_and_verifies(tmp_path):
    blocks = ["transformer.h.0", "transformer.h.1"]
    plan = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=2, schedule="gpipe",
                stages=[blocks[:1], blocks[1:]], predicted={"step_time_s": 0.01})  # fmt: skip
    plan_path = plan.save(tmp_path / "plan.json")
    result = _run(
        [
            str(ROOT / "examples/gpt.py"),
            "--plan",
            str(plan_path),
            "--steps",
            "3",
            "--verify",
            "--out",
            str(tmp_path / "run"),
        ],
        SMALL_GPT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
    rows = list(csv.DictReader((tmp_path / "run/measured.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert all(float(r["step_time_s"]) > 0 and float(r["loss"]) > 0 and int(r["peak_memory_bytes"]) > 0 for r in rows)
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["predicted_step_time_s"] == 0.01 and summary["warmup_steps"] == 1
    assert summary["median_step_time_s"] > 0 and summary["verify"]["passed"] is True


@pytest.mark.parametrize(
    "lossy,steps,said",
    [
        (dict(grad_reduce_dtype="bf16"), 2, "gradients are reduced in bf16"),
        (dict(grad_compression="powersgd", powersgd_rank=1), 3, "step 2 (compressed by PowerSGD): within tolerance"),
    ],
    ids=["fp32-reduced-in-bf16", "powersgd"],
)
def test_lossy_plans_verify_under_their_own_tolerance_and_steady_state(tmp_path, lossy, steps, said):
    """Issue 29 items 11-12: an fp32 plan reducing in bf16 is judged by bf16's tolerance (it
    reported FAILED, exit 3), and a PowerSGD plan is verified over 3 steps, the third compressed
    and judged against the same compression (it compared the first, uncompressed, step only)."""
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, **lossy)
    stdout, verify = _verified_gpt(tmp_path, plan, steps, SMALL_GPT)
    assert said in stdout
    assert verify["steps"] == list(range(steps))


@pytest.mark.parametrize(
    "outer,steps,said",
    [
        (dict(outer_optimizer="nesterov", outer_lr=1.0, outer_momentum=0.0), 2, "step 1: within tolerance"),
        (dict(sync_every=3, outer_optimizer="nesterov"), 6, "step 5: outer sync; replicas had drifted"),
    ],
    ids=["diloco-h1-lr1-equals-synchronous", "diloco-h3-replicas-identical-after-each-sync"],
)
def test_local_sgd_verifies_exactly_where_it_must_and_by_its_invariant_elsewhere(tmp_path, outer, steps, said):
    """Issue 36: DiLoCo at H = 1, lr 1, momentum 0 is the synchronous run and is compared with the reference
    (execute/local_sgd.py); at H = 3 the verify says it is approximate and checks that every outer sync leaves
    the replicas' parameters identical (execute/job/replicas.py), after they drifted apart in between."""
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, **outer)
    stdout, verify = _verified_gpt(tmp_path, plan, steps, SMALL_GPT)
    assert said in stdout
    if plan.sync_every > 1:
        assert verify["approximate"] and verify["steps"] == [2, 5] and verify["replica_spread_after_sync"] == 0.0
        assert "drifted 0.000e+00" not in stdout  # the inner steps did not sync the replicas
    else:
        assert verify["steps"] == [0, 1] and verify["tensors"] > 10


def test_crashing_rank_stops_the_job_and_is_named(tmp_path):
    model = tmp_path / "crash.py"
    model.write_text(
        textwrap.dedent("""
        import os, torch
        def build_model():
            if os.environ.get("RANK") == "1":
                raise RuntimeError("rank one exploded")
            return torch.nn.Linear(4, 4)
        def example_inputs(batch_size):
            return (torch.randn(batch_size, 4),)
    """)
    )
    plan_path = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1).save(tmp_path / "plan.json")
    result = _run(
        [str(model), "--plan", str(plan_path), "--steps", "2", "--out", str(tmp_path / "run"), "--timeout-s", "600"],
        timeout=120,
    )
    assert result.returncode == 2
    assert "rank 1 failed" in result.stderr and "rank one exploded" in result.stderr
    assert not (tmp_path / "run/summary.json").exists()


# Wide enough that FSDP2's bf16 parameters (bf16 residual stream, norms and bias gradients)
# differ from autocast's fp32-parameter numerics by far more than bf16 roundoff (~9% on
# layer-norm biases): --verify must compare against a reference with the run's own policy.
BF16_GPT = {
    "AUTOPLAN_GPT_N_LAYER": "2",
    "AUTOPLAN_GPT_N_EMBD": "128",
    "AUTOPLAN_GPT_N_HEAD": "4",
    "AUTOPLAN_GPT_VOCAB_SIZE": "1024",
    "AUTOPLAN_GPT_BLOCK_SIZE": "256",
}


@pytest.mark.parametrize("precision,zero", [("bf16", 2), ("fp16", 2), ("fp16", 0)])
def test_low_precision_dp2_verifies_against_the_same_policy(tmp_path, precision, zero):
    plan = Plan(
        devices=2, dp=2, tp=1, pp=1, zero_stage=zero, precision=precision, micro_batch_size=2, num_microbatches=1
    )
    _, verify = _verified_gpt(tmp_path, plan, 3, BF16_GPT)
    assert (
        verify["passed"]
        and verify["tensors"] > 10
        and verify["worst_relative_diff"] <= {"bf16": 3e-2, "fp16": 5e-3}[precision]
    )
    if precision == "fp16":  # the loss was scaled: a step that overflowed was skipped, never applied
        assert verify["loss_scale"] >= 1.0 and verify["step"] == verify["skipped_steps"]


def test_meta_device_model_is_materialised_identically_on_every_rank(tmp_path):
    model = tmp_path / "meta_mlp.py"
    model.write_text(
        textwrap.dedent("""
        import torch
        def build_model():
            with torch.device("meta"):
                return torch.nn.Sequential(
                    torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
                )
        def example_inputs(batch_size):
            return (torch.randn(batch_size, 8),)
    """)
    )
    plan = Plan(devices=2, dp=2, tp=1, pp=1, zero_stage=3, micro_batch_size=2, num_microbatches=2).save(
        tmp_path / "plan.json"
    )
    result = _run([str(model), "--plan", str(plan), "--steps", "2", "--verify", "--out", str(tmp_path / "run")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
    losses = [float(r["loss"]) for r in csv.DictReader((tmp_path / "run/measured.csv").open())]
    assert all(loss == loss and loss != 0.0 for loss in losses)  # real numbers, not uninitialised memory


def test_run_audit_writes_predicted_beside_measured(tmp_path):
    """`autoplan run --audit`: every rank's collectives as priced on a DDP plan of examples/gpt.py,
    and the parameters each rank holds; `autoplan report` summarises the audit."""
    plan_path = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, profile="cpu-gloo").save(
        tmp_path / "plan.json"
    )
    result = _run(
        [
            str(ROOT / "examples/gpt.py"),
            "--plan",
            str(plan_path),
            "--steps",
            "1",
            "--audit",
            "--out",
            str(tmp_path / "run"),
        ],
        SMALL_GPT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "audit: 2 of 2 collective rows as priced" in result.stdout
    rows = list(csv.DictReader((tmp_path / "run/audit.csv").open()))
    assert {r["rank"] for r in rows} == {"0", "1"}
    comm = [r for r in rows if r["what"] == "comm dp all_reduce"]
    assert len(comm) == 2 and all(float(r["measured"]) == float(r["predicted"]) > 0 for r in comm)
    held = [r for r in rows if r["what"] == "parameters held"]
    assert all(float(r["measured"]) == float(r["predicted"]) for r in held)


#: per attention call and rank, what each cp variant sends on dim cp (kind, count, message bytes as a multiple
#: of one local [B, H, S/cp, D] tensor, at cp = 2): allgather gathers K and V (2 x cp local tensors) forward and
#: reduce-scatters dK and dV backward; Ulysses moves q, k, v, o forward and dO, dQ, dK, dV backward, one each
CP_MESSAGES = {"allgather": [("all_gather", 1, 2 * 2), ("reduce_scatter", 1, 2 * 2)], "ulysses": [("all_to_all", 8, 1)]}


@pytest.mark.parametrize("variant", sorted(CP_MESSAGES))
def test_context_parallel_run_verifies_and_audits_the_kv_exchange(tmp_path, variant):
    """`autoplan run --verify --audit` at cp=2 (examples/gpt.py: positions from torch.arange in the root
    forward, causal SDPA): the run matches the single-process reference, and each rank's exchange of
    keys and values is counted on dim cp as CP_MESSAGES says."""
    plan = Plan(devices=2, dp=1, cp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, profile="cpu-gloo",
                cp_variant=variant)  # fmt: skip
    _verified_gpt(tmp_path, plan, 2, SMALL_GPT, "--audit")
    rows = list(csv.DictReader((tmp_path / "run/audit.csv").open()))
    layers, heads, seq, head_dim, fp32 = 2, 4, 16, 32 // 4, 4
    local_bytes = plan.micro_batch_size * heads * (seq // plan.cp) * head_dim * fp32
    calls = layers * plan.num_microbatches
    for kind, count, tensors in CP_MESSAGES[variant]:
        comm = [r for r in rows if r["what"] == f"comm cp {kind}"]
        assert len(comm) == 2 and all(float(r["measured"]) == calls * count * tensors * local_bytes for r in comm)
    assert [r for r in rows if r["what"] == "comm dp all_reduce"]  # the gradient sync over dp x cp


def test_recompute_that_applies_to_no_block_is_refused(tmp_path):
    model = tmp_path / "flat.py"
    model.write_text(
        textwrap.dedent("""
        import torch
        def build_model():
            return torch.nn.Linear(4, 4)
        def example_inputs(batch_size):
            return (torch.randn(batch_size, 4),)
    """)
    )
    plan_path = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, recompute="full").save(
        tmp_path / "plan.json"
    )
    result = _run([str(model), "--plan", str(plan_path), "--steps", "1", "--out", str(tmp_path / "run")], timeout=120)
    assert result.returncode == 2
    assert "recompute='full'" in result.stderr and "holds none of the blocks" in result.stderr
