"""Accelerate export: every exported YAML goes through ``accelerate launch``'s own parsing
(``launch_command_parser``, ``_validate_launch_command``, ``prepare_multi_gpu_env``), and the
environment it hands the workers builds Accelerate's ``FullyShardedDataParallelPlugin`` and
``ParallelismConfig``, whose settings must be the plan's; ``read`` gives the plan back."""

from __future__ import annotations

import dataclasses
import os
from unittest import mock

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy

import autoplan.trace
from autoplan.export import accelerate as acc_export
from autoplan.export.common import ModelFacts
from autoplan.types import Plan

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PLANS = {
    "ddp-bf16": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=4, precision="bf16"),
    "zero1-fp16": Plan(
        devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1, precision="fp16",
        grad_reduce_dtype="fp16",
    ),
    "zero2-fp32": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, zero_stage=2),
    "zero3-bf16-full": Plan(
        devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=3, precision="bf16",
        grad_reduce_dtype="bf16", recompute="full",
    ),
    "zero3-fp8-selective": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, zero_stage=3, precision="fp8",
        recompute="selective",
    ),
    "tp2-zero3": Plan(
        devices=16, dp=8, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3, precision="bf16",
        grad_reduce_dtype="bf16", sequence_parallel=True,
    ),
    "hsdp2x4-zero3": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                          precision="bf16", dp_replicate=2),  # HSDP: dp_replicate_size 2 x dp_shard_size 4
    "tp2-zero0": Plan(devices=8, dp=4, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, precision="bf16"),
    "pp2-zero1": Plan(
        devices=16, dp=8, tp=1, pp=2, micro_batch_size=1, num_microbatches=8, zero_stage=1, precision="bf16",
        grad_reduce_dtype="bf16",
    ),
    "pp2-ddp": Plan(devices=8, dp=4, tp=1, pp=2, micro_batch_size=1, num_microbatches=4),
    "zero3-bf16-offload-full": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                                    precision="bf16", offload="full"),
    "cp2-zero3": Plan(devices=8, dp=4, tp=1, pp=1, cp=2, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                      precision="bf16", grad_reduce_dtype="bf16"),
    "cp2-ring-tp2-zero0": Plan(devices=8, dp=2, tp=2, pp=1, cp=2, cp_variant="ring", micro_batch_size=1,
                               num_microbatches=2, precision="bf16", grad_reduce_dtype="bf16"),
}  # fmt: skip


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def launch():
    """What ``accelerate launch --config_file PATH train.py`` builds, without starting anything:
    its parsed arguments, the workers' environment, and the FSDP and parallelism plugins made from it."""
    pytest.importorskip("accelerate", reason="Accelerate is not installed (pip install accelerate)")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    def run(path):
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        args, _, _ = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
        with mock.patch.dict(os.environ, env):
            fsdp = FullyShardedDataParallelPlugin() if args.use_fsdp else None
            sizes = ParallelismConfig() if args.use_parallelism_config else None
        return args, env, fsdp, sizes

    return run


def _needs(plan: Plan) -> None:
    if plan.precision == "fp8":
        pytest.importorskip("torchao", reason="Accelerate's fp8 (backend AO) needs torchao")
    if plan.tp > 1:
        pytest.importorskip("transformers", reason="Accelerate's tensor parallelism needs transformers")


@pytest.mark.parametrize("name", PLANS)
def test_accelerate_launch_builds_the_plans_settings(name, facts, launch, tmp_path):
    plan = PLANS[name]
    _needs(plan)
    exported = acc_export.export(plan, facts)
    path = tmp_path / exported.filename
    path.write_text(exported.text)
    args, env, fsdp, sizes = launch(path)

    assert args.num_processes == plan.devices and args.num_machines == -(-plan.devices // 8)
    assert env["ACCELERATE_MIXED_PRECISION"] == {"fp32": "no"}.get(plan.precision, plan.precision)
    if plan.precision == "fp8":
        assert env["ACCELERATE_FP8_BACKEND"] == "AO"
    if plan.zero_stage == 0 and plan.tp == plan.cp == 1:
        assert args.multi_gpu and fsdp is None  # DDP
        return
    assert args.use_fsdp and fsdp.fsdp_version == 2
    assert fsdp.reshard_after_forward == (plan.zero_stage == 3)
    assert fsdp.activation_checkpointing == (plan.recompute != "none")
    assert fsdp.auto_wrap_policy is not None
    assert isinstance(fsdp.cpu_offload, CPUOffloadPolicy) == (plan.offload == "full")  # export/offload.py
    reduce = torch.float32
    if env["ACCELERATE_MIXED_PRECISION"] != "no":
        fsdp.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])  # as AcceleratorState does
        reduce = fsdp.mixed_precision_policy.reduce_dtype
    named = any(u.startswith("grad_reduce_dtype=") for u in exported.unexpressed)
    assert (reduce == TORCH_DTYPES[plan.grad_reduce_dtype]) != named  # the plan's dtype, or said not to be
    if plan.tp == plan.cp == plan.dp_replicate == 1:
        assert sizes is None
        return
    assert (sizes.dp_replicate_size, sizes.dp_shard_size, sizes.tp_size, sizes.cp_size) == (
        plan.dp_replicate,
        plan.dp * plan.pp // plan.dp_replicate,
        plan.tp,
        plan.cp,
    )
    if plan.cp > 1:  # torch's context parallelism, its KV rotation the plan's variant
        strategy = {"allgather": "allgather", "ring": "alltoall"}[plan.cp_variant]
        assert (sizes.cp_backend, sizes.cp_handler.cp_comm_strategy) == ("torch", strategy)
    assert sizes.total_size == args.num_processes  # Accelerate checks this only inside Accelerator()


def test_fsdp_reduces_in_the_plans_dtype_or_says_so(facts):
    assert not any("grad_reduce_dtype" in u for u in acc_export.export(PLANS["zero3-bf16-full"], facts).unexpressed)
    assert not any("grad_reduce_dtype" in u for u in acc_export.export(PLANS["ddp-bf16"], facts).unexpressed)
    said = acc_export.export(PLANS["zero3-fp8-selective"], facts).unexpressed
    assert any("grad_reduce_dtype=fp32: this config reduces gradients in bf16" in u for u in said)


def test_the_block_class_is_wrapped_when_known(facts, launch, tmp_path):
    exported = acc_export.export(PLANS["zero2-fp32"], dataclasses.replace(facts, block_class="DecoderLayer"))
    path = tmp_path / exported.filename
    path.write_text(exported.text)
    _, _, fsdp, _ = launch(path)
    assert fsdp.transformer_cls_names_to_wrap == ["DecoderLayer"]
    assert "add your block class" in acc_export.export(PLANS["zero2-fp32"], facts).text


@pytest.mark.parametrize("name", PLANS)
def test_read_gives_the_plan_back(name, facts):
    plan = PLANS[name]
    imported = acc_export.read(acc_export.export(plan, facts).text)
    back = imported.plan()
    # What Accelerate runs: no pipeline (its ranks data-parallel), ZeRO-1 as ZeRO-2, TP only under FSDP2.
    zero = 2 if (plan.zero_stage == 1 or (plan.zero_stage == 0 and plan.tp * plan.cp > 1)) else plan.zero_stage
    assert (back.devices, back.dp, back.tp, back.pp) == (plan.devices, plan.dp * plan.pp, plan.tp, 1)
    assert (back.cp, back.cp_variant) == (plan.cp, plan.cp_variant)
    assert (back.micro_batch_size, back.num_microbatches) == (plan.micro_batch_size, plan.num_microbatches)
    assert back.zero_stage == zero and back.precision == plan.precision and back.dp_replicate == plan.dp_replicate
    assert back.recompute == ("none" if plan.recompute == "none" else "full")
    if not any("grad_reduce_dtype" in u for u in acc_export.export(plan, facts).unexpressed):
        assert back.grad_reduce_dtype == plan.grad_reduce_dtype
    assert back.offload == plan.offload
    assert not imported.unmapped


def test_read_without_comments_takes_the_batch_from_the_caller(facts):
    text = "\n".join(line for line in acc_export.export(PLANS["zero3-bf16-full"], facts).text.splitlines()
                     if not line.startswith("#"))  # fmt: skip
    assert acc_export.read(text, batch_size=64).fields["micro_batch_size"] == 4
    plain = acc_export.read(text)
    assert plain.fields["micro_batch_size"] == 1 and any("training-script argument" in a for a in plain.assumptions)


def test_unexpressed_items_are_named_in_the_result_and_the_file(facts):
    def said(name: str) -> str:
        exported = acc_export.export(PLANS[name], facts)
        assert all(f"# - {sentence}" in exported.text for sentence in exported.unexpressed)
        return " ".join(exported.unexpressed)

    assert "Accelerator(gradient_accumulation_steps=4)" in said("ddp-bf16")
    assert "zero_stage=1" in said("zero1-fp16") and "no FSDP2 equivalent" in said("zero1-fp16")
    assert "recompute=selective" in said("zero3-fp8-selective")
    assert "no pipeline parallelism" in said("pp2-zero1") and "2x the plan's" in said("pp2-zero1")
    assert "only under FSDP2" in said("tp2-zero0") and "sequence_parallel" in said("tp2-zero3")
    assert "num_machines assumes 8 devices per machine" in acc_export.export(PLANS["ddp-bf16"], facts).text


def test_recomputation_under_ddp_is_said_not_dropped(facts):
    """A MULTI_GPU (DDP) config has no checkpointing key: the file once left recompute out with no note (and a
    selective plan's note said it was written as full)."""
    for mode in ("full", "selective"):
        exported = acc_export.export(dataclasses.replace(PLANS["ddp-bf16"], recompute=mode), facts)
        said = " ".join(exported.unexpressed)
        assert f"recompute={mode}: a DDP (MULTI_GPU) config has no activation-checkpointing key" in said
        assert "gradient_checkpointing_enable()" in said and "written as full" not in said


def test_launch_command_is_accelerates_own(facts):
    exported = acc_export.export(PLANS["ddp-bf16"], facts)  # one machine; more: test_accelerate_start.py
    assert exported.launch == "accelerate launch --config_file accelerate_fsdp.yaml train.py"
    assert exported.filename == "accelerate_fsdp.yaml"
    assert "num_machines: 4" in acc_export.export(PLANS["zero3-bf16-full"], facts, devices_per_node=4).text


def test_tensor_parallelism_alone_is_refused_not_written(facts):
    """tp=2 at dp=1 was written with a warning that Accelerator() refuses it, and exit 0 (docs/export.md: what a
    framework cannot run at all is refused)."""
    from autoplan.export import ExportError

    alone = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, precision="bf16")
    with pytest.raises(ExportError, match=r"Accelerate cannot run tp=2 alone \(dp=1\)"):
        acc_export.export(alone, facts)
