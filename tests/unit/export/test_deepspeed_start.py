"""DeepSpeed starts every family autoplan exports: each ``ds_config.json`` goes, unedited, into
``deepspeed.initialize`` on a tiny model on the CPU (gloo), which then takes one optimizer step
(every micro-batch of the accumulation, forward and backward, then ``step``).

In this process, as a world of one rank: ZeRO 0-3 under fp32, bf16, fp16 and fp8 (bf16 to
DeepSpeed), with and without activation checkpointing, and the pipeline families through
``PipelineEngine`` (a one-stage ``PipelineModule``). On two ranks (slow): a two-stage pipeline,
AutoTP on a tiny Hugging Face Llama, and ZeRO-0/2 over two data-parallel ranks.

DeepSpeed on the CPU needs two allowances, neither part of what a config selects: its CPU
accelerator JIT-compiles a shared-memory all-reduce kernel at start-up (about 40 s, a C++
compiler) that gloo does without, and it declines fp16 because CPUs have no fast fp16 kernels;
the fp16 engine (loss scaler, FP16 and ZeRO optimizers) is device-independent, so the tests let
it run. Its BF16_Optimizer also forces four memory printouts, each after a ``gc.collect()`` of
the whole (test) process; they only report, so the tests leave them out.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from contextlib import ExitStack, contextmanager
from unittest import mock

import pytest
import torch

from autoplan.export import deepspeed as ds_export
from autoplan.export.common import ModelFacts
from autoplan.jobs.spawn import report, spawn_ranks
from autoplan.types import Plan

FACTS = ModelFacts(name="tiny", layers=2)
WIDTH = 8
PRECISIONS = ("fp32", "bf16", "fp16")  # fp8 is bf16 to DeepSpeed (Transformer Engine is model code): two cases


def _plan(**fields) -> Plan:
    sizes = {"devices": fields.get("dp", 1) * fields.get("tp", 1) * fields.get("pp", 1)}
    return Plan(**{"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 2, "num_microbatches": 2, **sizes, **fields})


PIPE = [["0"], ["1"]]
ONE_RANK = {
    **{f"zero{z}-{p}": _plan(zero_stage=z, precision=p) for z in range(4) for p in PRECISIONS},
    **{f"zero{z}-fp8": _plan(zero_stage=z, precision="fp8") for z in (0, 3)},
    "zero0-bf16-full": _plan(precision="bf16", recompute="full", num_microbatches=1),
    "zero3-fp16-selective": _plan(zero_stage=3, precision="fp16", recompute="selective"),
    "zero1-bf16-reduce-bf16": _plan(zero_stage=1, precision="bf16", grad_reduce_dtype="bf16"),
    "zero1-fp32-no-overlap": _plan(zero_stage=1, overlap_grad_reduce=False, num_microbatches=4),
    **{f"pp2-zero0-{p}": _plan(pp=2, precision=p, stages=PIPE) for p in PRECISIONS},
    "pp2-zero3-bf16": _plan(pp=2, zero_stage=3, precision="bf16", stages=PIPE),  # DeepSpeed's pipeline: ZeRO-1
    "pp2-zero0-bf16-full": _plan(pp=2, precision="bf16", recompute="full", stages=PIPE),
    # ZeRO-Offload on one rank (Ren et al.'s one-GPU setup): written as ZeRO-1 with offload_optimizer
    "zero0-bf16-offload-optimizer": _plan(precision="bf16", offload="optimizer"),
}
TWO_RANKS = {
    "pp2-zero1-bf16": _plan(pp=2, zero_stage=1, precision="bf16", stages=PIPE, num_microbatches=4),
    "tp2-zero1-bf16": _plan(tp=2, zero_stage=1, precision="bf16"),
    "dp2-zero0-bf16": _plan(dp=2, precision="bf16"),
    "dp2-zero2-fp16": _plan(dp=2, zero_stage=2, precision="fp16", grad_reduce_dtype="fp16"),
    # ZeRO-Offload: DeepSpeed refuses a torch optimizer under offload unless the file allows it (export/offload.py)
    "dp2-zero1-offload-optimizer-bf16": _plan(dp=2, zero_stage=1, precision="bf16", offload="optimizer"),
    "dp2-zero3-offload-full-bf16": _plan(dp=2, zero_stage=3, precision="bf16", offload="full"),
}


@contextmanager
def deepspeed_on_cpu(rank: int, world: int, store_path: str):
    """DeepSpeed's CPU accelerator and a gloo world met at a file (``store_path``, new for each world:
    no port to race for), with the allowances of the module docstring. One engine a world, as in a
    real job: leaving the world resets DeepSpeed's global groups (the mpu a pipeline or AutoTP engine
    installs), which the next engine would otherwise inherit."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    ds_comm = importlib.import_module("deepspeed.comm.torch")  # `import ... as` finds deepspeed.comm's torch
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
    before = get_accelerator()
    with ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env))
        stack.enter_context(mock.patch.object(ds_comm, "build_shm_op", return_value=None))
        stack.enter_context(mock.patch.object(CPU_Accelerator, "is_fp16_supported", return_value=True))
        stack.enter_context(mock.patch("deepspeed.runtime.bf16_optimizer.see_memory_usage"))
        # A ZeRO-3 engine replaces torch.nn.functional.linear for the whole process and never puts it back
        # (deepspeed/runtime/zero/partition_parameters.py); later tests in this process trace with the real one.
        stack.enter_context(mock.patch.object(torch.nn.functional, "linear", torch.nn.functional.linear))
        set_accelerator(CPU_Accelerator())
        torch.distributed.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
        deepspeed.init_distributed(dist_backend="gloo")  # takes the world it finds
        try:
            yield
        finally:
            deepspeed.comm.destroy_process_group()
            set_accelerator(before)


class Block(torch.nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.Linear(2 * WIDTH, WIDTH)
        self.checkpointed = checkpointed

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.checkpointed:
            return self._forward(x)
        import deepspeed

        return deepspeed.checkpointing.checkpoint(self._forward, x)  # as the exported note tells the user


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out.float() - target.float()).pow(2).mean()


def _model(plan: Plan, config: dict) -> torch.nn.Module:
    import deepspeed

    checkpointed = plan.recompute != "none"
    if checkpointed:  # the model code's side of activation checkpointing, configured from the file
        deepspeed.checkpointing.configure(None, deepspeed_config=config)
    if plan.tp > 1:
        from transformers import LlamaConfig, LlamaForCausalLM

        sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 2, "vocab_size": 32, "max_position_embeddings": 16}  # fmt: skip
        return LlamaForCausalLM(LlamaConfig(**sizes))
    # An input layer first: DeepSpeed's (reentrant) checkpoint needs an input that requires grad.
    blocks = [torch.nn.Linear(WIDTH, WIDTH)] + [Block(checkpointed) for _ in range(2)]
    if plan.pp > 1:
        world = int(os.environ["WORLD_SIZE"])
        return deepspeed.pipe.PipelineModule(layers=blocks, num_stages=min(plan.pp, world), loss_fn=_loss)
    return torch.nn.Sequential(*blocks)


def _one_step(plan: Plan) -> dict:
    """Start DeepSpeed on the exported file and take one optimizer step; what the engine ran."""
    import deepspeed

    config = json.loads(ds_export.export(plan, FACTS).text)
    torch.manual_seed(0)
    model = _model(plan, config)
    whole = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    dtype = next(engine.module.parameters()).dtype
    batches = [_batch(plan, dtype) for _ in range(plan.num_microbatches)]
    if plan.pp > 1:
        loss = engine.train_batch(data_iter=iter(batches))
    for inputs, target in batches if plan.pp == 1 else []:
        loss = engine(input_ids=inputs, labels=inputs).loss if plan.tp > 1 else _loss(engine(inputs), target)
        engine.backward(loss)
        engine.step()
    return {"steps": engine.global_steps, "skipped": engine.skipped_steps, "loss": loss.item(), "dtype": str(dtype),
            "zero": engine.zero_optimization_stage(), "optimizer": type(engine.optimizer).__name__,
            "held": sum(p.numel() for p in engine.module.parameters()) / whole}  # fmt: skip


def _batch(plan: Plan, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if plan.tp > 1:  # token ids, the same on both tp ranks (AutoTP checks that they are)
        ids = torch.randint(0, 32, (plan.micro_batch_size, 8), generator=torch.Generator().manual_seed(1))
        return ids, ids
    return torch.randn(plan.micro_batch_size, WIDTH).to(dtype), torch.zeros(plan.micro_batch_size, WIDTH)


def _check(plan: Plan, ran: dict) -> None:
    assert (ran["steps"], ran["skipped"]) == (1, 0) and math.isfinite(ran["loss"])
    assert ran["zero"] == ds_export.zero_stage(plan)
    assert ran["dtype"] == {"fp32": "torch.float32", "fp16": "torch.float16"}.get(plan.precision, "torch.bfloat16")


@pytest.mark.parametrize("name", ONE_RANK)
def test_deepspeed_starts_the_export_and_steps(name, tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    plan = ONE_RANK[name]
    with deepspeed_on_cpu(0, 1, str(tmp_path / "store")):
        _check(plan, _one_step(plan))


def test_without_zero_a_low_precision_export_says_where_gradients_accumulate():
    said = " ".join(ds_export.export(ONE_RANK["zero0-bf16"], FACTS).unexpressed)
    assert "accumulates gradients in the training dtype (bf16" in said
    assert "zero_stage=0" not in " ".join(ds_export.export(ONE_RANK["zero1-bf16"], FACTS).unexpressed)
    # A bf16 pipeline runs DeepSpeed's BF16_Optimizer, which accumulates in fp32 whatever the file says.
    assert "zero_stage=0" not in " ".join(ds_export.export(ONE_RANK["pp2-zero0-bf16"], FACTS).unexpressed)


def _two_rank_worker(rank, world, port, names, folder, messages):
    def work():  # a world of its own for each engine (deepspeed_on_cpu)
        ran = {}
        for name in names:
            with deepspeed_on_cpu(rank, world, os.path.join(folder, f"{name}.store")):
                ran[name] = _one_step(TWO_RANKS[name])
        return ran

    report(messages, rank, work)


@pytest.mark.slow
def test_deepspeed_starts_pipeline_autotp_and_data_parallel_exports_on_two_ranks(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    pytest.importorskip("transformers", reason="DeepSpeed's AutoTP splits a Hugging Face model")
    ranks = spawn_ranks(
        _two_rank_worker, processes=2, args=(list(TWO_RANKS), str(tmp_path)), timeout_s=300, what="starting DeepSpeed"
    )
    for name, plan in TWO_RANKS.items():
        for rank in (0, 1):
            _check(plan, ranks[rank][name])
            assert (ranks[rank][name]["held"] < 1) == (plan.tp > 1)  # AutoTP split the Llama over the two ranks
        assert ranks[0][name]["loss"] == ranks[1][name]["loss"] or plan.dp > 1  # one loss per model replica
