"""DeepSpeed export: every exported ``ds_config.json`` is loaded by DeepSpeed's own
``DeepSpeedConfig``, whose derived batch arithmetic, ZeRO stage and dtypes must equal the plan's;
a tampered batch is refused by DeepSpeed itself; ``read`` gives the plan back."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from unittest import mock

import pytest
import torch

import autoplan.trace
from autoplan.export import deepspeed as ds_export
from autoplan.export.common import ExportError, ModelFacts
from autoplan.types import Plan

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
STAGES4 = [["layers.0"], ["layers.1"], ["layers.2"], ["layers.3"]]
PLANS = {
    "ddp-fp32": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=4),
    "zero1-bf16": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=4, num_microbatches=2, zero_stage=1, precision="bf16",
    ),
    "zero1-fp16-no-overlap": Plan(
        devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=1, precision="fp16",
        grad_reduce_dtype="fp16", overlap_grad_reduce=False,
    ),
    "zero2-fp16": Plan(
        devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, zero_stage=2, precision="fp16",
    ),
    "zero3-bf16-full": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=8, zero_stage=3, precision="bf16",
        grad_reduce_dtype="bf16", recompute="full",
    ),
    "zero3-fp8-selective": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, zero_stage=3, precision="fp8",
        recompute="selective",
    ),
    "tp2-zero1": Plan(
        devices=16, dp=8, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1, precision="bf16",
        sequence_parallel=True, tp_plan={"layers.0.attn.q": "colwise", "layers.0.attn.o": "rowwise"},
    ),
    "pp2-tp2-interleaved": Plan(
        devices=16, dp=4, tp=2, pp=2, micro_batch_size=1, num_microbatches=8, schedule="interleaved_1f1b",
        virtual_stages=2, zero_stage=1, precision="bf16", stages=STAGES4,
    ),
    "pp4-1f1b": Plan(
        devices=8, dp=2, tp=1, pp=4, micro_batch_size=2, num_microbatches=8, precision="bf16", stages=STAGES4,
    ),
    "pp2-zero3": Plan(
        devices=8, dp=4, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, zero_stage=3, precision="bf16",
        stages=[["layers.0", "layers.1", "layers.2"], ["layers.3"]],
    ),
    "ep2": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, ep=2, zero_stage=1),
    "cp2-ulysses-zero3": Plan(devices=8, dp=4, tp=1, pp=1, cp=2, cp_variant="ulysses", micro_batch_size=1,
                              num_microbatches=2, zero_stage=3, precision="bf16"),
    "powersgd": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, grad_compression="powersgd",
        powersgd_rank=4,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def ds_config():
    """DeepSpeed's own config loader, with the data-parallel size given through a minimal mpu and
    ``dist.get_rank`` patched (DeepSpeedConfig asks for the rank before it consults the mpu)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    config_module = importlib.import_module("deepspeed.runtime.config")

    class DataParallelOnly:
        def __init__(self, dp: int) -> None:
            self.dp = dp

        def get_data_parallel_world_size(self) -> int:
            return self.dp

    class UlyssesOnly:  # the mpu Ulysses hands deepspeed.initialize (UlyssesSPAttentionHF.register_with_transformers)
        def __init__(self, sp: int) -> None:
            self.sp = sp

        def get_sequence_parallel_world_size(self) -> int:
            return self.sp

    def load(source, dp: int, *, sp: int = 1, world: int = 1):
        """With ``sp`` > 1, DeepSpeed's two Ulysses paths, whose data-parallel world is world / sp: the
        Ulysses mpu, and no mpu with the config as a dict (its ``sequence_parallel_size``, which DeepSpeed
        reads only from a dict: HF's integration passes one); the two must agree."""
        with mock.patch.object(config_module.dist, "get_rank", return_value=0):
            if sp == 1:
                return config_module.DeepSpeedConfig(source, mpu=DataParallelOnly(dp))
            with mock.patch.object(config_module.dist, "get_world_size", return_value=world):
                ulysses = config_module.DeepSpeedConfig(source, mpu=UlyssesOnly(sp))
                keyed = config_module.DeepSpeedConfig(json.loads(Path(source).read_text()))
            assert (keyed.world_size, keyed.train_batch_size) == (ulysses.world_size, ulysses.train_batch_size)
            return ulysses

    return load


@pytest.fixture(scope="module")
def deepspeed_names(ds_config) -> set[str]:
    """Every top-level key DeepSpeed names (it ignores unknown ones silently, so we check)."""
    modules = ("constants", "config", "zero.config", "precision_config", "activation_checkpointing.config")
    names = {"tensor_parallel", "sequence_parallel_size"}  # literals in DeepSpeedConfig and its TP config
    for name in modules:
        module = importlib.import_module(f"deepspeed.runtime.{name}")
        names |= {v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)}
    return names


@pytest.mark.parametrize("name", PLANS)
def test_deepspeed_loads_the_export_with_the_plans_numbers(name, facts, ds_config, deepspeed_names, tmp_path):
    plan = PLANS[name]
    exported = ds_export.export(plan, facts)
    path = tmp_path / exported.filename
    path.write_text(exported.text)
    config = ds_config(str(path), plan.dp, sp=plan.cp, world=plan.devices)

    assert config.world_size == plan.dp
    assert config.train_batch_size == plan.global_batch_size
    assert config.train_micro_batch_size_per_gpu == plan.micro_batch_size
    assert config.gradient_accumulation_steps == plan.num_microbatches
    assert config.zero_optimization_stage == ds_export.zero_stage(plan)
    assert ds_export.zero_stage(plan) == (min(plan.zero_stage, 1) if plan.pp > 1 else plan.zero_stage)
    if ds_export.zero_stage(plan):
        assert config.zero_config.overlap_comm == plan.overlap_grad_reduce
    assert config.bfloat16_config.enabled == (plan.precision in ("bf16", "fp8"))
    assert config.float16_config.enabled == (plan.precision == "fp16")
    if plan.precision == "fp16":
        assert config.float16_config.loss_scale == 0  # dynamic
    assert config.communication_data_type == TORCH_DTYPES[plan.grad_reduce_dtype]
    low = {"fp16": "fp16", "fp32": "fp32"}.get(plan.precision, "bf16")  # DeepSpeed without ZeRO: the model's dtype
    assert config.grad_accum_dtype == ("fp32" if ds_export.zero_stage(plan) else low)
    assert ("train_batch_size" in json.loads(exported.text)) == (plan.tp == 1)  # AutoTP counts tp ranks in it
    assert (config.tensor_parallel_config.autotp_size or 1) == plan.tp  # 0: AutoTP off
    assert config.expert_parallel_config.enabled == (plan.ep > 1)
    assert config.expert_parallel_config.autoep_size == plan.ep
    data = json.loads(exported.text)
    assert ("activation_checkpointing" in data) == (plan.recompute != "none")
    assert set(data) - {"autoplan"} <= deepspeed_names


def test_deepspeed_itself_refuses_a_tampered_batch(facts, ds_config):
    plan = PLANS["zero3-bf16-full"]
    data = json.loads(ds_export.export(plan, facts).text)
    data["train_batch_size"] += plan.dp
    with pytest.raises(AssertionError, match="train_batch_size"):
        ds_config(data, plan.dp)
    with pytest.raises(AssertionError):
        ds_config(json.loads(ds_export.export(plan, facts).text), plan.dp * 2)  # the wrong world size too


@pytest.mark.parametrize("name", PLANS)
def test_read_gives_the_plan_back(name, facts):
    plan = PLANS[name]
    text = ds_export.export(plan, facts).text
    # None: dp from train_batch_size / (mbs * ga); under AutoTP the file has none, and the 'autoplan' section's
    # global batch stands for it.
    for devices in (plan.devices, None):
        back = ds_export.read(text, devices=devices).plan()
        same = ("devices", "dp", "tp", "pp", "cp", "ep", "micro_batch_size", "num_microbatches")
        assert {k: getattr(back, k) for k in same} == {k: getattr(plan, k) for k in same}
        assert back.cp_variant == ("ulysses" if plan.cp > 1 else "allgather")  # DeepSpeed's one form: Ulysses
        assert back.zero_stage == ds_export.zero_stage(plan)
        # DeepSpeed runs one 1F1B schedule with one chunk a stage: interleaved chunks read back as balanced stages.
        assert (back.schedule, back.virtual_stages) == (plan.schedule if plan.virtual_stages == 1 else "1f1b", 1)
        assert back.stages == (plan.stages if plan.virtual_stages == 1 else [])
        assert back.grad_reduce_dtype == plan.grad_reduce_dtype
        assert back.precision == ("bf16" if plan.precision == "fp8" else plan.precision)
        assert back.recompute == ("none" if plan.recompute == "none" else "full")
        assert back.overlap_grad_reduce == (plan.overlap_grad_reduce and back.zero_stage > 0)


def test_unexpressed_items_are_named_in_the_result_and_the_file(facts):
    def said(name: str) -> str:
        exported = ds_export.export(PLANS[name], facts)
        assert json.loads(exported.text)["autoplan"]["unexpressed"] == exported.unexpressed
        return " ".join(exported.unexpressed)

    assert said("zero3-bf16-full").startswith("recompute: DeepSpeed's checkpointing is invoked by model code")
    assert "selective" in said("zero3-fp8-selective") and "Transformer Engine" in said("zero3-fp8-selective")
    assert "pp=4" in said("pp4-1f1b") and "PipelineModule" in said("pp4-1f1b")
    assert "schedule=interleaved_1f1b" in said("pp2-tp2-interleaved")
    assert "refuses ZeRO-2/3" in said("pp2-zero3") and "stages of [3, 1] blocks" in said("pp2-zero3")
    tp = said("tp2-zero1")
    assert "autotp_size" in tp and "sequence_parallel" in tp and "per-op choice" in tp
    assert "powersgd" in said("powersgd") and "overlap_grad_reduce" in said("powersgd")
    assert said("zero1-bf16") == ""
    hsdp = ds_export.export(dataclasses.replace(PLANS["zero1-bf16"], dp_replicate=2), facts)
    assert " ".join(hsdp.unexpressed).startswith("dp_replicate=2 (HSDP): DeepSpeed has no replicated ZeRO groups")


def test_launch_command_is_deepspeeds_own(facts):
    assert ds_export.export(PLANS["pp2-tp2-interleaved"], facts).launch == (
        "deepspeed --num_nodes 2 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json"
    )
    assert ds_export.export(PLANS["zero2-fp16"], facts).launch.startswith("deepspeed --num_nodes 1 --num_gpus 4 ")


def test_read_names_what_autoplan_does_not_price():
    text = json.dumps(
        {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 4,
            "zero_optimization": {
                "stage": 3,
                "offload_param": {"device": "cpu"},
                "offload_optimizer": {"device": "nvme"},
            },
            "bf16": {"enabled": True},
        }
    )
    imported = ds_export.read(text, devices=8)
    assert imported.fields["dp"] == 8 and imported.fields["micro_batch_size"] == 2
    assert imported.fields["grad_reduce_dtype"] == "bf16"  # DeepSpeed's default: the training dtype
    assert any("offload_param to cpu" in u for u in imported.unmapped)
    assert any("offload_optimizer to nvme" in u for u in imported.unmapped)
    assert any("pipeline degree" in u for u in imported.unmapped)
    imported.plan()
    auto = ds_export.read(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2}), devices=4)
    assert (auto.fields["micro_batch_size"], auto.fields["num_microbatches"]) == (2, 1)


def test_read_refuses_what_deepspeed_would_refuse():
    with pytest.raises(ExportError, match="pass --devices"):
        ds_export.read(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    with pytest.raises(ExportError, match="refuses"):
        ds_export.read(json.dumps({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 2,
                                   "gradient_accumulation_steps": 2}), devices=8)  # fmt: skip
    with pytest.raises(ExportError, match="pass --devices"):  # the Hugging Face Trainer's "auto"
        ds_export.read(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}))
    with pytest.raises(ExportError, match="not valid JSON"):
        ds_export.read("{")
