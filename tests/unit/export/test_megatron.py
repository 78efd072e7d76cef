"""Megatron-LM export: every exported ``megatron_args.txt`` starts Megatron-LM as far as a CPU can.
Megatron-LM's own ``parse_args``, ``validate_args`` and ``core_transformer_config_from_args``
(``megatron/training/arguments.py`` at tag core_v0.16.1, vendored as test data in megatron_lm/:
the megatron-core wheel does not ship it) run on the file's flags with the launch line's
environment and WORLD_SIZE, over the installed megatron-core 0.16.1, whose TransformerConfig and
DistributedDataParallelConfig check the combination; the values Megatron derives (dp size,
virtual stages, micro-batch count, ...) must equal the plan's. Megatron-FSDP exports must also set
what its user guide lists as required. ``read`` gives the plan back.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import sys
import warnings
from pathlib import Path

import pytest
import torch

import autoplan.trace
from autoplan.errors import PlanError
from autoplan.export import megatron
from autoplan.export.common import ExportError, ModelFacts
from autoplan.types import Plan
from autoplan.types.offload import one_rank_offload

STAGES4 = [["layers.0"], ["layers.1"], ["layers.2"], ["layers.3"]]
PLANS = {
    "ddp-fp32": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=4),
    "zero1-bf16": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=4, num_microbatches=2, zero_stage=1,
                       precision="bf16"),
    "zero1-fp16-no-overlap": Plan(
        devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=1, precision="fp16",
        grad_reduce_dtype="fp16", overlap_grad_reduce=False,
    ),
    "zero1-bf16-param-gather": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=2,
                                    zero_stage=1, precision="bf16", overlap_param_gather=True),
    # HSDP: 2 distributed-optimizer instances over 4 ranks each; Megatron-FSDP's hybrid FSDP
    "hsdp2x4-zero1": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, zero_stage=1,
                          precision="bf16", dp_replicate=2),
    "hsdp2x2-tp2-zero3": Plan(devices=8, dp=4, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                              precision="bf16", sequence_parallel=True, dp_replicate=2),
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
    "zero1-fp8-te-delayed": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=1,
                                 precision="fp8", runtime="megatron", fp8_recipe="te_delayed"),
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
    # MoE Parallel Folding: the experts' ep group spans the tp ranks; and each expert split over etp = tp
    "tp2-ep2-folded": Plan(devices=4, dp=2, tp=2, pp=1, micro_batch_size=1, num_microbatches=1, ep=2, zero_stage=1,
                           precision="bf16", sequence_parallel=True, routing={"imbalance": 1.25}),
    "tp2-ep2-etp2": Plan(devices=8, dp=4, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, ep=2, expert_tp=2,
                         zero_stage=1, precision="bf16", sequence_parallel=True, routing={"imbalance": 1.25}),
    # the EP all-to-all overlapped (types/moe_overlap.py): --overlap-moe-expert-parallel-comm, at pp > 1 with VPP
    "ep2-a2a-overlap": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, ep=2, zero_stage=1,
                            precision="bf16", recompute="selective", runtime="megatron", moe_a2a_overlap=True),
    "pp2-v2-ep2-a2a-overlap": Plan(devices=8, dp=4, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, ep=2,
                                   schedule="interleaved_1f1b", virtual_stages=2, precision="bf16",
                                   runtime="megatron", moe_a2a_overlap=True),
    "fp32-reduce-bf16": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1,
                             grad_reduce_dtype="bf16"),
    "tp2-zero3": Plan(devices=8, dp=4, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                      precision="bf16", sequence_parallel=True),
    "cp2-allgather-tp2": Plan(devices=8, dp=2, tp=2, pp=1, cp=2, micro_batch_size=1, num_microbatches=2,
                              zero_stage=1, precision="bf16", sequence_parallel=True),
    "cp2-ring-pp2-zero3": Plan(devices=8, dp=2, tp=1, pp=2, cp=2, cp_variant="ring", micro_batch_size=1,
                               num_microbatches=4, zero_stage=3, precision="bf16", stages=[STAGES4[0] + STAGES4[1],
                               STAGES4[2] + STAGES4[3]]),
    "cp2-ulysses": Plan(devices=4, dp=2, tp=1, pp=1, cp=2, cp_variant="ulysses", micro_batch_size=1,
                        num_microbatches=2, precision="bf16"),
    # budgeted recompute: Megatron's block method, one count for every chunk (the largest), or none for selective
    "pp2-budget-full": Plan(devices=4, dp=2, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, precision="bf16",
                            recompute="full", recompute_blocks=[2, 1], stages=[STAGES4[0] + STAGES4[1],
                            STAGES4[2] + STAGES4[3]]),
    "zero1-budget-selective": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1,
                                   precision="bf16", recompute="selective", recompute_blocks=[3]),
    "powersgd": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, grad_compression="powersgd",
        powersgd_rank=4,
    ),
    "zero1-bf16-offload": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1,
                               precision="bf16", offload="optimizer"),
    "one-rank-offload": Plan(devices=1, dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, precision="bf16",
                             offload="optimizer"),  # ZeRO-Offload on one GPU: the distributed optimizer's offload
    "zero1-offload-activations": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2,
                                      zero_stage=1, precision="bf16", offload_activations=True),
}  # fmt: skip
VENDORED = Path(__file__).parent / "megatron_lm"  # Megatron-LM's own argument code, core_v0.16.1 (its README.md)


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def megatron_lm():
    """Megatron-LM's ``megatron/training/arguments.py`` (vendored, see megatron_lm/README.md) over the
    installed megatron-core."""
    pytest.importorskip("megatron.core", reason="megatron-core 0.16.1 is not installed (pip install megatron-core)")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(VENDORED))
        from megatron.training import arguments, utils

        yield arguments, utils
    for name in [n for n in sys.modules if n.startswith("megatron.training")]:
        del sys.modules[name]


def _start(megatron_lm, exported, *, world: int, extra: tuple[str, ...] = (), arch: int = 9):
    """What ``pretrain_gpt.py`` does with the exported file before it builds a model: the launch
    line's environment, ``$(grep -v '^#' megatron_args.txt)`` word-split onto the command line,
    WORLD_SIZE from torchrun, then Megatron-LM's parse_args, validate_args and
    core_transformer_config_from_args. ``arch`` stands in for the GPU (utils.DEVICE_ARCH)."""
    arguments, utils = megatron_lm
    flags = " ".join(line for line in exported.text.splitlines() if not line.startswith("#")).split()
    env = dict(word.split("=", 1) for word in exported.launch.split(" torchrun ")[0].split() if "=" in word)
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
        for name, value in {**env, "WORLD_SIZE": str(world), "RANK": "0"}.items():
            patch.setenv(name, value)
        patch.setattr(sys, "argv", ["pretrain_gpt.py", *flags, *extra])
        patch.setattr(utils, "DEVICE_ARCH", arch)
        args = arguments.parse_args()
        arguments.validate_args(args)
        return args, arguments.core_transformer_config_from_args(args)


def _user_flags(plan: Plan) -> tuple[str, ...]:
    """What the file's comments ask the user to add (the expert count under ep; ModelFacts has none), and
    under expert_tp > 1 no linear biases (Megatron-Core refuses biases in MoE at ETP > 1: export/megatron_moe.py)."""
    experts = ("--num-experts", str(4 * plan.ep)) if plan.ep > 1 else ()
    return experts + (("--disable-bias-linear",) if plan.expert_tp > 1 else ())


@pytest.mark.parametrize("name", PLANS)
def test_megatron_lm_starts_from_the_export_with_the_plans_numbers(name, facts, megatron_lm):
    plan = PLANS[name]
    exported = megatron.export(plan, facts)
    assert "--num-experts" in exported.text or plan.ep == 1  # the comment asking for it
    assert "--disable-bias-linear" in exported.text or plan.expert_tp == 1  # and the one asking for this
    args, config = _start(megatron_lm, exported, world=plan.devices, extra=_user_flags(plan))
    assert args.data_parallel_size == plan.dp  # Megatron: world / (tp * pp * cp)
    assert args.num_distributed_optimizer_instances == plan.dp_replicate  # HSDP's replicas
    assert config.context_parallel_size == plan.cp
    assert config.cp_comm_type == (megatron.CP_COMM_TYPES[plan.cp_variant] if plan.cp > 1 else "p2p")
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (plan.tp, plan.pp)
    assert config.expert_model_parallel_size == plan.ep
    if plan.routing is not None or plan.ep > 1:  # a MoE plan: the experts' own layout (export/megatron_moe.py)
        assert config.expert_tensor_parallel_size == plan.expert_tp
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.virtual_stages
    if plan.stages and len({len(s) for s in plan.stages}) > 1:  # uneven: first/last, or the layout
        assert _blocks_per_chunk(config, plan) == [len(stage) for stage in plan.stages]
    assert (config.sequence_parallel, config.tp_comm_overlap) == (plan.sequence_parallel, plan.tp_comm_overlap)
    assert config.overlap_moe_expert_parallel_comm == plan.moe_a2a_overlap  # with the dispatcher it needs
    assert config.moe_token_dispatcher_type == ("alltoall" if plan.moe_a2a_overlap else "allgather")
    assert config.bf16 == (plan.precision in ("bf16", "fp8")) and config.fp16 == (plan.precision == "fp16")
    assert (config.fp8, config.fp8_recipe) == (
        ("hybrid", megatron.FP8_RECIPES[plan.fp8_recipe_used]) if plan.precision == "fp8" else (None, "delayed")
    )
    assert config.recompute_granularity == (None if plan.recompute == "none" else plan.recompute)
    if plan.recompute == "full":  # a budget: the first k layers of each chunk (Megatron's block method)
        expected = ("block", max(plan.recompute_blocks)) if plan.recompute_blocks else ("uniform", 1)
        assert (config.recompute_method, config.recompute_num_layers) == expected
    assert (config.num_layers, config.hidden_size, config.num_attention_heads, config.num_query_groups) == (
        facts.layers, facts.hidden_size, facts.num_heads, facts.num_kv_heads,
    )  # fmt: skip
    assert args.seq_length == facts.seq_len
    assert args.optimizer_cpu_offload == (plan.offload == "optimizer")  # ZeRO-Offload (export/offload.py)
    offloaded = (True, facts.layers - 1) if plan.offload_activations else (False, 0)  # export/activation_offload.py
    assert (config.cpu_offloading, config.cpu_offloading_num_layers) == offloaded
    _check_data_parallel(args, plan)


def _blocks_per_chunk(config, plan: Plan) -> list[int]:
    """Transformer blocks of each chunk (chunk c on pipeline rank c % pp) as Megatron will build them."""
    layout = config.pipeline_model_parallel_layout
    if layout is None:
        first, last = config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage
        middle = (config.num_layers - first - last) // (plan.pp - 2) if plan.pp > 2 else 0
        return [first] + [middle] * (plan.pp - 2) + [last]
    from megatron.core.transformer.enums import LayerType

    return [
        layout.layout[c % plan.pp][c // plan.pp].count(LayerType.decoder) for c in range(plan.pp * plan.virtual_stages)
    ]


def _check_data_parallel(args, plan: Plan) -> None:
    """Megatron's data-parallel arguments, and the DistributedDataParallelConfig its training.py
    (get_model) builds from them, equal the plan's."""
    from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    fields = dataclasses.fields(DistributedDataParallelConfig)
    kwargs = {f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)}
    ddp = DistributedDataParallelConfig(**{**kwargs, "grad_reduce_in_fp32": args.accumulate_allreduce_grads_in_fp32})
    assert ddp.use_distributed_optimizer == (plan.zero_stage >= 1 or one_rank_offload(plan))  # its CPU offload
    assert ddp.use_megatron_fsdp == (plan.zero_stage >= 2)
    sharding = {0: "no_shard", 1: "no_shard", 2: "optim_grads", 3: "optim_grads_params"}
    assert ddp.data_parallel_sharding_strategy == sharding[plan.zero_stage]
    assert ddp.overlap_grad_reduce == plan.overlap_grad_reduce
    assert ddp.overlap_param_gather == (plan.zero_stage == 3 or plan.overlap_param_gather)  # as priced
    assert ddp.grad_reduce_in_fp32 == (plan.precision != "fp32" and plan.grad_reduce_dtype == "fp32")
    assert args.grad_reduce_in_bf16 == (plan.precision in ("bf16", "fp8") and plan.grad_reduce_dtype == "bf16")
    calculator = ConstantNumMicroBatchesCalculator(
        args.global_batch_size, args.micro_batch_size, args.data_parallel_size, False, 0
    )
    assert calculator.get() == plan.num_microbatches


def _required_fsdp_flags() -> list[str]:
    """The "Required Configurations" block of Megatron-LM's Megatron-FSDP user guide (core_v0.16.1)."""
    guide = (VENDORED / "megatron-fsdp-user-guide.md").read_text()
    block = guide.split("### Required Configurations", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return block.split()


@pytest.mark.parametrize("name", [n for n, p in PLANS.items() if p.zero_stage >= 2])
def test_megatron_fsdp_exports_set_what_its_user_guide_requires(name, facts, megatron_lm):
    """Megatron-LM's validate_args accepts Megatron-FSDP without these flags; its user guide lists
    them as required. Read both through Megatron-LM's own parser and compare the settings."""
    arguments, _ = megatron_lm
    plan = PLANS[name]
    args, _ = _start(megatron_lm, megatron.export(plan, facts), world=plan.devices, extra=_user_flags(plan))
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    required = _required_fsdp_flags()
    assert "--use-distributed-optimizer" in required and "--no-gradient-accumulation-fusion" in required
    wanted = parser.parse_args(required)
    dests = {parser._option_string_actions[w].dest for w in required if w.startswith("--")}
    dests.discard("data_parallel_sharding_strategy")  # the guide's example is ZeRO-3's; the plan's is checked above
    assert {d: getattr(args, d) for d in dests} == {d: getattr(wanted, d) for d in dests}


def test_megatron_lm_itself_refuses_a_tampered_export(facts, megatron_lm):
    """The start-up check can fail: Megatron-LM's own checks refuse edits of the export."""
    plan = PLANS["tp2-sp-overlap-selective"]
    exported = megatron.export(plan, facts)
    tp3 = dataclasses.replace(
        exported, text=exported.text.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 3")
    )
    with pytest.raises(ValueError, match="num_attention_heads"):
        _start(megatron_lm, tp3, world=24)  # TransformerConfig: 3 does not divide the heads
    no_env = dataclasses.replace(exported, launch=exported.launch.replace("CUDA_DEVICE_MAX_CONNECTIONS=1 ", ""))
    with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        _start(megatron_lm, no_env, world=plan.devices)  # validate_args on Hopper
    _start(megatron_lm, no_env, world=plan.devices, arch=10)  # Blackwell lifts that requirement
    cp = megatron.export(PLANS["cp2-ulysses"], facts)
    odd = dataclasses.replace(cp, text=cp.text.replace(f"--seq-length {facts.seq_len}", "--seq-length 250"))
    with pytest.raises(AssertionError, match="seq-length should be a multiple of 2 \\* context-parallel-size"):
        _start(megatron_lm, odd, world=4)  # validate_args: head-tail load balancing needs 2cp | seq-length
    ddp = megatron.export(PLANS["ddp-fp32"], facts)
    with pytest.raises(AssertionError, match="--overlap-param-gather only supported with distributed optimizer"):
        _start(megatron_lm, ddp, world=8, extra=("--overlap-param-gather",))
    vpp = megatron.export(PLANS["pp2-v2-ep2-a2a-overlap"], facts)
    one_chunk = dataclasses.replace(vpp, text=vpp.text.replace("--num-layers-per-virtual-pipeline-stage 1\n", ""))
    with pytest.raises(AssertionError, match="virtual_pipeline_model_parallel_size must be specified"):
        _start(megatron_lm, one_chunk, world=8, extra=("--num-experts", "8"))  # the overlap at pp > 1 needs VPP


def test_an_overlap_megatron_cannot_run_is_written_without_its_flag_and_said(facts, megatron_lm):
    """A plan priced with the all-to-all overlapped under plain 1F1B at pp > 1 (the whole-run check's DualPipe
    stand-in): Megatron-Core refuses the flag there, so the export leaves it out, says so, and starts."""
    plan = dataclasses.replace(PLANS["pp2-v2-ep2-a2a-overlap"], schedule="1f1b", virtual_stages=1)
    exported = megatron.export(plan, facts)
    assert "--overlap-moe-expert-parallel-comm" not in [line for line in exported.text.splitlines() if line[0] != "#"]
    assert any("virtual stages" in item and "moe_a2a_overlap" in item for item in exported.unexpressed)
    _args, config = _start(megatron_lm, exported, world=8, extra=("--num-experts", "8"))
    assert not config.overlap_moe_expert_parallel_comm


@pytest.mark.parametrize("name", PLANS)
def test_read_gives_the_plan_back(name, facts):
    plan = PLANS[name]
    text = megatron.export(plan, facts).text
    one_line = " ".join(line for line in text.splitlines() if not line.startswith("#"))
    for source, devices in ((text, None), (text, plan.devices), (one_line, plan.devices)):
        imported = megatron.read(source, devices=devices)
        back = imported.plan()
        same = ("devices", "dp", "tp", "pp", "cp", "cp_variant", "ep", "micro_batch_size", "num_microbatches",
                "virtual_stages", "zero_stage", "recompute", "precision", "sequence_parallel", "tp_comm_overlap",
                "overlap_grad_reduce", "overlap_param_gather", "dp_replicate", "expert_tp",
                "moe_a2a_overlap")  # fmt: skip
        assert {k: getattr(back, k) for k in same} == {k: getattr(plan, k) for k in same}
        assert back.schedule == ("1f1b" if plan.schedule == "gpipe" else plan.schedule)
        expressible = plan.grad_reduce_dtype == "fp32" or plan.precision in ("bf16", "fp8", "fp16")
        assert back.grad_reduce_dtype == (plan.grad_reduce_dtype if expressible else "fp32")
        uneven = {"pp2-uneven": "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 3",
                  "pp2-v2-uneven-middle": "--pipeline-model-parallel-layout Et|tt|t|L"}  # fmt: skip
        said = (
            [f"{uneven[name]}: uneven stages; autoplan reads a config with balanced stages."] if name in uneven else []
        )
        if plan.offload_activations:  # priced for autoplan's executor only (export/activation_offload.py)
            said.append(f"--cpu-offloading-num-layers {facts.layers - 1}: not a setting autoplan prices; ignored.")
        assert imported.unmapped == said
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
    assert "GPipe" in said("pp4-gpipe") and said("pp2-uneven") == "" and said("pp2-v2-uneven-middle") == ""
    tp = said("tp2-sp-overlap-selective")
    assert "attention core" in tp and "per-op choice" in tp
    assert "gradient reduction in bf16 with fp32" in said("fp32-reduce-bf16")
    assert "PowerSGD" in said("powersgd")


def test_a_zero_bubble_schedule_is_said_megatron_core_has_none(facts):
    plan = dataclasses.replace(PLANS["pp4-gpipe"], schedule="interleaved_zb")
    exported = megatron.export(plan, facts)
    assert any("zero-bubble" in item and "written as 1F1B" in item for item in exported.unexpressed)


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
    assert (fields["dp"], fields["tp"], fields["cp"], fields["devices"], fields["num_microbatches"]) == (4, 2, 2, 16, 8)
    assert fields["cp_variant"] == "ring" and "Megatron's default p2p" in imported.assumptions[-1]
    said = " ".join(imported.unmapped)
    for words in ("--lr 3e-4", "--data-path /data/a /data/b", "--use-flash-attn"):
        assert words in said
    assert len(imported.unmapped) == 3 and fields["fp8_recipe"] == "te_delayed"  # Megatron's default, priced
    assert fields["recompute_blocks"] == [2]  # block: the first 2 layers of the one chunk (a recompute budget)
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
    with pytest.raises(ExportError, match="alltoall or flex"):  # Megatron-Core asserts the dispatcher
        megatron.read("--expert-model-parallel-size 2 --overlap-moe-expert-parallel-comm", devices=2)


def test_megatrons_weight_gather_is_read_as_it_runs():
    """ZeRO-1/2 with --overlap-param-gather is priced gathering under the next forward (the executor
    runs it under ZeRO-1, execute/param_gather.py, and refuses it under ZeRO-2); Megatron-FSDP ZeRO-3
    without it gathers on demand (priced prefetched: named)."""
    import dataclasses

    from autoplan.execute.tp_overlap import check_runs_here

    zero1 = megatron.read("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --bf16", devices=8)
    assert zero1.fields["overlap_param_gather"] and zero1.unmapped == []
    check_runs_here(zero1.plan())
    with pytest.raises(PlanError, match="overlaps only ZeRO-1's parameter all-gather"):
        check_runs_here(dataclasses.replace(zero1.plan(), zero_stage=2))
    refused = megatron.read("--use-distributed-optimizer --overlap-param-gather --bf16", devices=8)
    assert not refused.fields["overlap_param_gather"] and "Megatron-LM refuses it" in refused.unmapped[0]
    zero3 = "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer"
    imported = megatron.read(zero3 + " --overlap-grad-reduce --bf16", devices=8)
    assert imported.fields["zero_stage"] == 3 and "gathers each block's weights when" in imported.unmapped[0]
    assert megatron.read(zero3 + " --overlap-grad-reduce --overlap-param-gather", devices=8).unmapped == []


def test_a_model_without_attention_is_said_to_be_no_transformer():
    """An LSTM exported to Megatron said nothing, and Megatron's validate_args refused the file (no heads)."""

    class LSTMModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn = torch.nn.Embedding(50, 16), torch.nn.LSTM(16, 16, batch_first=True)
            self.head = torch.nn.Linear(16, 50)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0])

    graph = autoplan.trace.trace(LSTMModel(), (torch.zeros(2, 8, dtype=torch.long),))
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)
    said = " ".join(megatron.export(plan, ModelFacts.from_graph(graph)).unexpressed)
    assert "calls no scaled_dot_product_attention" in said
    assert "scaled_dot_product_attention" not in " ".join(megatron.export(plan, ModelFacts()).unexpressed)
