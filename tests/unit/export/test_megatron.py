"""Megatron-LM export: every exported ``megatron_args.txt`` is checked by megatron-core 0.16.1's own
code. Megatron-LM generates most of its flags from megatron-core's ``TransformerConfig`` and
``DistributedDataParallelConfig`` fields (a field ``x_y`` is ``--x-y`` unless its ``argparse_meta``
names the flag), so the test maps each flag to its field by that rule, builds both dataclasses
(whose ``__post_init__`` checks the combination), and takes the micro-batch count from
megatron-core's ``ConstantNumMicroBatchesCalculator``; the values must equal the plan's.
``read`` gives the plan back. Megatron-LM's own ``arguments.py`` is not on PyPI and is not copied.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import autoplan.trace
from autoplan.export import megatron
from autoplan.export.common import ExportError, ModelFacts
from autoplan.types import Plan

STAGES4 = [["layers.0"], ["layers.1"], ["layers.2"], ["layers.3"]]
PLANS = {
    "ddp-fp32": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=4),
    "zero1-bf16": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=4, num_microbatches=2, zero_stage=1,
                       precision="bf16"),
    "zero1-fp16-no-overlap": Plan(
        devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=1, precision="fp16",
        grad_reduce_dtype="fp16", overlap_grad_reduce=False,
    ),
    "zero2-fp16": Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, zero_stage=2,
                       precision="fp16"),
    "zero3-bf16-full": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=8, zero_stage=3, precision="bf16",
        grad_reduce_dtype="bf16", recompute="full",
    ),
    "tp2-sp-overlap-selective": Plan(
        devices=16, dp=8, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1, precision="bf16",
        sequence_parallel=True, tp_comm_overlap=True, recompute="selective",
        tp_plan={"layers.0.attn.q": "colwise", "layers.0.attn.o": "rowwise"},
    ),
    "pp2-tp2-interleaved-fp8": Plan(
        devices=16, dp=4, tp=2, pp=2, micro_batch_size=1, num_microbatches=8, schedule="interleaved_1f1b",
        virtual_stages=2, zero_stage=1, precision="fp8", sequence_parallel=True, stages=STAGES4,
    ),
    "pp2-interleaved-no-stages": Plan(
        devices=4, dp=2, tp=1, pp=2, micro_batch_size=2, num_microbatches=4, schedule="interleaved_1f1b",
        virtual_stages=2, precision="bf16",
    ),
    "pp4-gpipe": Plan(devices=8, dp=2, tp=1, pp=4, micro_batch_size=2, num_microbatches=8, schedule="gpipe",
                      precision="bf16", stages=STAGES4),
    "pp2-uneven": Plan(
        devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, precision="bf16",
        stages=[["layers.0"], ["layers.1", "layers.2", "layers.3"]],
    ),
    "pp2-v2-uneven-middle": Plan(
        devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule="interleaved_1f1b",
        virtual_stages=2, stages=[["layers.0"], ["layers.1", "layers.2"], ["layers.3"], []],
    ),
    "ep2": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, ep=2, zero_stage=1,
                precision="bf16"),
    "fp32-reduce-bf16": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1,
                             grad_reduce_dtype="bf16"),
    "powersgd": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, grad_compression="powersgd",
        powersgd_rank=4,
    ),
}  # fmt: skip
#: Megatron-LM flags defined in its own arguments.py (tag core_v0.16.1), not generated from a megatron-core field.
TRAINING_FLAGS = {
    "--micro-batch-size", "--global-batch-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--seq-length", "--max-position-embeddings", "--group-query-attention",
    "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--ckpt-format",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
}  # fmt: skip
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def mcore():
    """megatron-core's config dataclasses, the flag each field is given on Megatron-LM's command line, and the
    micro-batch calculator."""
    pytest.importorskip("megatron.core", reason="megatron-core 0.16.1 is not installed (pip install megatron-core)")
    from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

    def flag_names(cls) -> dict[str, str]:
        names = {}
        for f in dataclasses.fields(cls):
            meta = f.metadata.get("argparse_meta", {})
            for flag in meta.get("arg_names", ["--" + f.name.replace("_", "-")]):
                names[flag] = f.name
        return names

    return {
        "transformer": (TransformerConfig, flag_names(TransformerConfig)),
        "ddp": (DistributedDataParallelConfig, flag_names(DistributedDataParallelConfig)),
        "calculator": ConstantNumMicroBatchesCalculator,
    }


def _flags(text: str) -> dict[str, str | bool]:
    flags = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            flag, *value = line.split()
            flags[flag] = value[0] if value else True
    return flags


def _value(raw):
    return raw if raw is True or not str(raw).lstrip("-").isdigit() else int(raw)


def _megatron_configs(text: str, mcore, plan: Plan):
    """TransformerConfig and DistributedDataParallelConfig built from the flags as Megatron-LM does."""
    flags = _flags(text)
    (tc_cls, tc_names), (ddp_cls, ddp_names) = mcore["transformer"], mcore["ddp"]
    unknown = set(flags) - set(tc_names) - set(ddp_names) - TRAINING_FLAGS
    assert not unknown, f"flags Megatron-LM does not define: {unknown}"
    tc = {tc_names[f]: _value(v) for f, v in flags.items() if f in tc_names}
    ddp = {ddp_names[f]: _value(v) for f, v in flags.items() if f in ddp_names}
    ddp["grad_reduce_in_fp32"] = "--accumulate-allreduce-grads-in-fp32" in flags  # as Megatron-LM's training.py
    pp, layers = tc.get("pipeline_model_parallel_size", 1), tc.get("num_layers")
    if "--num-layers-per-virtual-pipeline-stage" in flags:  # as Megatron-LM's validate_args
        tc["virtual_pipeline_model_parallel_size"] = layers // (
            pp * int(flags["--num-layers-per-virtual-pipeline-stage"])
        )
    for end in ("first", "last"):  # as Megatron-LM's core_transformer_config_from_args
        if f"--decoder-{end}-pipeline-num-layers" in flags:
            tc[f"num_layers_in_{end}_pipeline_stage"] = int(flags[f"--decoder-{end}-pipeline-num-layers"])
    if "--num-virtual-stages-per-pipeline-rank" in flags:
        tc["virtual_pipeline_model_parallel_size"] = int(flags["--num-virtual-stages-per-pipeline-rank"])
    if plan.ep > 1:  # the expert count the file's comment asks for (ModelFacts has none)
        assert "--num-experts" in text
        tc["num_moe_experts"] = 4 * plan.ep
    dtype = DTYPES[plan.precision]  # Megatron-LM: params_dtype from --bf16/--fp16, pipeline_dtype = params_dtype
    return tc_cls(**tc, params_dtype=dtype, pipeline_dtype=dtype), ddp_cls(**ddp), flags


@pytest.mark.parametrize("name", PLANS)
def test_megatron_core_builds_the_export_with_the_plans_numbers(name, facts, mcore):
    plan = PLANS[name]
    config, ddp, flags = _megatron_configs(megatron.export(plan, facts).text, mcore, plan)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (plan.tp, plan.pp)
    assert config.expert_model_parallel_size == plan.ep
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.virtual_stages
    if plan.stages and plan.virtual_stages == 1 and len({len(s) for s in plan.stages}) > 1:
        ends = (config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage)
        assert ends == (len(plan.stages[0]), len(plan.stages[-1]))
    assert (config.sequence_parallel, config.tp_comm_overlap) == (plan.sequence_parallel, plan.tp_comm_overlap)
    assert config.bf16 == (plan.precision in ("bf16", "fp8")) and config.fp16 == (plan.precision == "fp16")
    assert (config.fp8, config.fp8_recipe) == (
        ("hybrid", "tensorwise") if plan.precision == "fp8" else (None, "delayed")
    )
    granularity = None if plan.recompute == "none" else plan.recompute
    assert config.recompute_granularity == granularity
    if plan.recompute == "full":
        assert (config.recompute_method, config.recompute_num_layers) == ("uniform", 1)
    assert (config.num_layers, config.hidden_size, config.num_attention_heads, config.num_query_groups) == (
        facts.layers, facts.hidden_size, facts.num_heads, facts.num_kv_heads,
    )  # fmt: skip
    assert ddp.use_distributed_optimizer == (plan.zero_stage == 1)
    assert ddp.use_megatron_fsdp == (plan.zero_stage >= 2)
    sharding = {0: "no_shard", 1: "no_shard", 2: "optim_grads", 3: "optim_grads_params"}
    assert ddp.data_parallel_sharding_strategy == sharding[plan.zero_stage]
    assert ddp.overlap_grad_reduce == plan.overlap_grad_reduce
    assert ddp.grad_reduce_in_fp32 == (plan.precision != "fp32" and plan.grad_reduce_dtype == "fp32")
    assert ("--grad-reduce-in-bf16" in flags) == (
        plan.precision in ("bf16", "fp8") and plan.grad_reduce_dtype == "bf16"
    )
    world = plan.devices  # the file's "# world size" line; Megatron-LM: dp = world / (tp * pp * cp)
    dp = world // (config.tensor_model_parallel_size * config.pipeline_model_parallel_size)
    gbs, mbs = int(flags["--global-batch-size"]), int(flags["--micro-batch-size"])
    assert mcore["calculator"](gbs, mbs, dp, False, 0).get() == plan.num_microbatches
    assert int(flags["--seq-length"]) == facts.seq_len


def test_megatron_core_itself_refuses_a_tampered_export(facts, mcore):
    plan = PLANS["tp2-sp-overlap-selective"]
    text = megatron.export(plan, facts).text
    with pytest.raises(ValueError, match="num_attention_heads"):
        _megatron_configs(text.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 3"), mcore, plan)
    gbs = plan.global_batch_size
    with pytest.raises(AssertionError, match="not divisible"):
        mcore["calculator"](gbs + 1, plan.micro_batch_size, plan.dp, False, 0)


@pytest.mark.parametrize("name", PLANS)
def test_read_gives_the_plan_back(name, facts):
    plan = PLANS[name]
    text = megatron.export(plan, facts).text
    one_line = " ".join(line for line in text.splitlines() if not line.startswith("#"))
    for source, devices in ((text, None), (text, plan.devices), (one_line, plan.devices)):
        imported = megatron.read(source, devices=devices)
        back = imported.plan()
        same = ("devices", "dp", "tp", "pp", "ep", "micro_batch_size", "num_microbatches", "virtual_stages",
                "zero_stage", "recompute", "precision", "sequence_parallel", "tp_comm_overlap",
                "overlap_grad_reduce")  # fmt: skip
        assert {k: getattr(back, k) for k in same} == {k: getattr(plan, k) for k in same}
        assert back.schedule == ("1f1b" if plan.schedule == "gpipe" else plan.schedule)
        expressible = plan.grad_reduce_dtype == "fp32" or plan.precision in ("bf16", "fp8", "fp16")
        assert back.grad_reduce_dtype == (plan.grad_reduce_dtype if expressible else "fp32")
        assert imported.unmapped == ([] if name != "pp2-uneven" else ["--decoder-first-pipeline-num-layers 1 "
                                     "--decoder-last-pipeline-num-layers 3: uneven stages; autoplan reads a config "
                                     "with balanced stages."])  # fmt: skip
        assert (imported.facts.layers, imported.facts.num_kv_heads) == (facts.layers, facts.num_kv_heads)


def _comments(text: str) -> str:
    lines = [line.lstrip("#").strip().removeprefix("- ") for line in text.splitlines() if line.startswith("#")]
    return " ".join(" ".join(lines).split())


def test_unexpressed_items_are_named_in_the_result_and_the_file(facts):
    def said(name: str) -> str:
        exported = megatron.export(PLANS[name], facts)
        for item in exported.unexpressed:
            assert " ".join(item.split()) in _comments(exported.text)
        return " ".join(exported.unexpressed)

    assert said("ddp-fp32") == "" and said("zero3-bf16-full") == "" and said("pp2-tp2-interleaved-fp8") == ""
    assert "GPipe" in said("pp4-gpipe") and said("pp2-uneven") == "" and "uneven" in said("pp2-v2-uneven-middle")
    tp = said("tp2-sp-overlap-selective")
    assert "attention core" in tp and "per-op choice" in tp
    assert "gradient reduction in bf16 with fp32" in said("fp32-reduce-bf16")
    assert "PowerSGD" in said("powersgd")


def test_missing_facts_become_comments_naming_the_flag():
    plan = PLANS["pp2-interleaved-no-stages"]
    exported = megatron.export(plan, ModelFacts())
    assert "--num-layers, --hidden-size" in _comments(exported.text)
    assert "--num-virtual-stages-per-pipeline-rank 2" in exported.text  # no layer count: v itself
    assert megatron.read(exported.text).plan().virtual_stages == 2


def test_launch_command_is_torchruns(facts):
    assert megatron.export(PLANS["tp2-sp-overlap-selective"], facts).launch == (
        "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
        "--rdzv-endpoint $HEAD_NODE:29500 pretrain_gpt.py $(grep -v '^#' megatron_args.txt) $DATA_ARGS"
    )
    assert megatron.export(PLANS["zero2-fp16"], facts).launch.startswith("torchrun --nnodes 1 --nproc-per-node 4 ")


def test_read_names_what_autoplan_does_not_price():
    args = (
        "--tensor-model-parallel-size 2 --context-parallel-size 2 --micro-batch-size 2 --global-batch-size 64 "
        "--bf16 --fp8-format e4m3 --recompute-granularity full --recompute-method block --recompute-num-layers 2 "
        "--lr 3e-4 --data-path /data/a /data/b --use-flash-attn"
    )
    imported = megatron.read(args, devices=16)
    fields = imported.fields
    assert (fields["dp"], fields["tp"], fields["devices"], fields["num_microbatches"]) == (4, 2, 8, 8)
    said = " ".join(imported.unmapped)
    for words in ("context parallelism", "--fp8-recipe delayed", "--recompute-method block", "--lr 3e-4",
                  "--data-path /data/a /data/b", "--use-flash-attn"):  # fmt: skip
        assert words in said
    assert len(imported.unmapped) == 6
    imported.plan()


def test_read_refuses_what_megatron_would_refuse():
    with pytest.raises(ExportError, match="pass devices"):
        megatron.read("--tensor-model-parallel-size 2")
    with pytest.raises(ExportError, match="not divisible by tp 4"):
        megatron.read("--tensor-model-parallel-size 4", devices=6)
    with pytest.raises(ExportError, match="not divisible by --micro-batch-size"):
        megatron.read("--micro-batch-size 2 --global-batch-size 30", devices=4)
    with pytest.raises(ExportError, match="needs --num-layers"):
        megatron.read("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2", devices=2)
    with pytest.raises(ExportError, match="expected an integer"):
        megatron.read("--micro-batch-size two", devices=2)
