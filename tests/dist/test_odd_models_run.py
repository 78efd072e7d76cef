"""Oddly shaped models run their plans for real on gloo and match the single-process reference."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from exec_harness import run_verified

from autoplan.modelfile import load_model_file
from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ODD = ROOT / "tests/odd_models"


@functools.cache
def _traced(name: str):
    """The odd model's traced graph (batch 8, this module's environment), once for the plans of it this
    file runs: plan_graph reads it without changing it (loop_moe's two plans from one trace and from two
    are the same but for the search time), and a trace is 0.9 s of CPU (loop_moe)."""
    return trace_model_file(ODD / f"{name}.py", 8)


@pytest.mark.parametrize(
    "name, fix",
    [
        ("two_modules", "dp=2,zero=3"),
        ("unlike_modules", "pp=2,schedule=1f1b,mbs=2"),  # called out of registration order; sends an LSTM's view
        ("one_block", "tp=2"),
        ("one_block", "dp=2,zero=3"),  # FSDP2 shards the block inside the list of one the tracer takes whole
        ("tied_top", "dp=2,zero=3"),  # the two top-level units share the tied weight: left to the root's
        ("mixed_blocks", "pp=2,schedule=1f1b,mbs=2"),
        ("nested", "pp=2,recompute=full"),
        ("shared_module", "dp=2,zero=1"),
        ("side_effects", "pp=2,schedule=gpipe"),
        ("loop_moe", "dp=2,zero=3,recompute=full"),  # FSDP2: every expert touched (execute/expert_loop.py)
        ("loop_moe", "tp=2,sp=true"),  # the MoE loop runs whole on each tp rank, on the gathered sequence
        ("loose_ends", "pp=2,recompute=full"),  # None and float inputs, a None output, a cat's gradient sent back
        ("frozen_stem", "pp=2"),  # the first stage's rank holds no parameter to train
        ("buffer_updates", "dp=2,mbs=2"),  # each dp rank updates its own buffers over its micro-batches
        ("buffer_updates", "pp=2,schedule=zb,recompute=full"),  # no_grad regions split; re-runs on found buffers
        ("shared_bias", "pp=2,schedule=zb,recompute=full"),  # W re-runs blocks that read a tensor the stage returns
        ("shared_table", "pp=2,schedule=1f1b,precision=bf16"),  # a parameter both stages read; finfo(x.dtype).min
        ("conv_layout", "pp=2,schedule=zbv"),  # W leaves channels-last weight gradients, fused AdamW reads by memory
        # nn.MultiheadAttention calls SDPA and its attention dropout inside a torch function torch's modes see whole:
        # cp left its attention on each shard alone, --verify its dropout on
        ("torch_transformer", "cp=2"),
        ("torch_transformer", "dp=2"),
        ("inplace_mlp", "pp=2,schedule=1f1b,recompute=selective"),  # ReLU(inplace=True) over a kept matmul output
        ("scalar_scale", "dp=2,zero=3,mbs=2"),  # fully_shard refuses a 0-dim parameter: replicated, averaged
        ("legacy_weight_norm", "dp=2"),  # --verify's reference: no deepcopy of a computed weight; built again
        ("ignored_tokens", "cp=2,mbs=2"),  # -100 targets: each cp rank's shard mean weighed by the tokens it scores
        ("torch_seq2seq", "pp=2,schedule=1f1b"),  # nn.Transformer's own layers, found inside it, on two stages
        ("batch_norm_cnn", "dp=2,zero=3,precision=bf16"),  # FSDP2 casts a batch norm's weight, not its statistics
        ("latent_queries", "pp=2,schedule=zbv"),  # a chunk sends on what it reads; torch detaches it after B
        ("optional_args", "pp=2,schedule=1f1b"),  # `if mask is not None:` with mask None: fx took the branch
        ("dict_target", "pp=2,schedule=1f1b,mbs=2"),  # torch's schedule splits a tensor target only
        ("dataclass_output", "pp=2,schedule=1f1b"),  # torch.export flattens the output: pytree knew no dataclass
        ("complex_filter", "dp=2,zero=3,mbs=2"),  # a complex parameter: unfused AdamW, left out of FSDP2's groups
        ("compiled_block", "dp=2,recompute=selective"),  # the checkpoint goes inside the file's torch.compile
        ("built_in_bf16", "dp=2,zero=3"),  # planned bf16, its reference stepping bf16 copies as the run does
        (
            "no_grad_stem",
            "dp=2,zero=1",
        ),  # a trainable parameter with no gradient: zeros in ZeRO-1, none in the reference
    ],
)
def test_odd_model_runs_its_plan_and_verifies(tmp_path, name, fix):
    plan = plan_graph(_traced(name), devices=2, profile="cpu-gloo", fix=fix).best
    if name == "frozen_stem":  # what the case is for: a stage of frozen blocks alone
        assert plan.stages[0] == ["blocks.0", "blocks.1"]
    path = plan.save(tmp_path / "plan.json")
    run_verified(ODD / f"{name}.py", path, tmp_path / "run", timeout=240)


def test_mamba_shaped_tp_split_computes_what_the_model_computes(tmp_path):
    """tests/odd_models/conv_mixer.py under the split that stopped Hugging Face Mamba (a convolution over the
    sequence shard) and, once that ran, doubled its gradients (a replicated head on the tied, sharded table)."""
    splits = {"embed": "colwise", "head": "replicate"}
    splits |= {
        f"layers.{i}.{name}": split for i in range(2) for name, split in (("proj", "rowwise"), ("out", "rowwise"))
    }
    plan = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=4, num_microbatches=1, sequence_parallel=True,
                precision="fp32", tp_plan=splits)  # fmt: skip
    run_verified(ODD / "conv_mixer.py", plan.save(tmp_path / "plan.json"), tmp_path / "run", timeout=240)


def test_a_loop_moe_whose_experts_some_rank_never_uses_runs_under_ddp(tmp_path, monkeypatch):
    """16 experts at top-1 and 16 tokens per rank: some expert gets no row on some rank, and its
    loop skips it (`continue`). DDP looks for such parameters (execute/expert_loop.py), so the
    step runs, and one no rank used keeps no gradient, as in the reference."""
    for name, value in dict(EXPERTS=16, TOP_K=1, SEQ=4).items():
        monkeypatch.setenv(f"AUTOPLAN_LOOP_MOE_{name}", str(value))
    model = ODD / "loop_moe.py"
    plan = plan_graph(trace_model_file(model, 8), devices=2, profile="cpu-gloo", fix="dp=2").best
    path = plan.save(tmp_path / "plan.json")
    run_verified(model, path, tmp_path / "run", timeout=240)


def test_ddp_runs_a_model_with_parameters_no_gradient_reaches(tmp_path):
    """DDP waits for every trainable parameter's gradient: one read only under torch.no_grad(), or never, stopped the
    planner's best plan at its first step. The executor finds them before DDP wraps the model, which then looks for
    unused parameters, and the plan computes what one device does."""
    model = ODD / "no_grad_stem.py"
    plan = plan_graph(_traced("no_grad_stem"), devices=2, profile="cpu-gloo", fix="dp=2,zero=0").best
    assert plan.runs_ddp
    run_verified(model, plan.save(tmp_path / "p.json"), tmp_path / "run", timeout=240)


def test_verify_compares_the_frozen_weights_of_every_pipeline_rank(tmp_path):
    """Under zbv rank 1 holds frozen_stem's second frozen block: its frozen weights were compared on rank 1 only,
    and rank 0's report (and verdict) left them out, so a step that changed them went unseen. Every rank's
    comparisons are gathered now: the loss, each trained parameter's gradient and update, each frozen weight."""
    plan = plan_graph(_traced("frozen_stem"), devices=2, profile="cpu-gloo", fix="pp=2,schedule=zbv").best
    assert plan.stages[1] == ["blocks.1"]  # a frozen block on the second rank
    run_verified(ODD / "frozen_stem.py", plan.save(tmp_path / "plan.json"), tmp_path / "run", timeout=240)
    model = load_model_file(ODD / "frozen_stem.py").build()
    trained = sum(p.requires_grad for p in model.parameters())
    frozen = sum(not p.requires_grad for p in model.parameters())
    verified = json.loads((tmp_path / "run" / "summary.json").read_text())["verify"]
    assert verified["tensors"] == 1 + 2 * trained + frozen, verified
