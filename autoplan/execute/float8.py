"""``plan.precision == "fp8"`` as it runs: torchao's float8 training on the eligible linears
(docs/executor.md, "FP8").

Every ``nn.Linear`` whose input and output features are both divisible by 16 per local shard
(``torch._scaled_mm``) becomes torchao's ``Float8Linear`` with the plan's recipe
(``Plan.fp8_recipe_used``, :func:`float8_config`): "tensorwise" (``Float8LinearConfig()``, dynamic
tensorwise scaling, e4m3 inputs and weights, e5m2 output gradients) or "rowwise"
(``Float8LinearConfig.from_recipe_name("rowwise")``, one scale per row, e4m3 throughout). Per GEMM
``Y = X W^T``, with ``s_T = fp8_max / amax(|T|)`` over the whole (global) tensor or per row:

    Y = (s_X X)_fp8 (s_W W)^T_fp8 / (s_X s_W)        accumulated in fp32

Everything else runs as "bf16". The linears are converted before TP, recomputation and data
parallelism (autoplan/execute/api.py); under TP the casts come after the redistributions
(:func:`tp_input`, :func:`tp_output`; tensorwise only: torchao's float8 TP styles scale per tensor).
:func:`check_runs_here` refuses a device without FP8 tensor cores (compute capability 8.9+), and
rowwise under TP; ``AUTOPLAN_FP8_EMULATE=1`` lets a CPU test run through (both recipes run there).
Under ZeRO-3 with tensorwise on NCCL, FSDP2 gathers the FP8 weights in FP8 (:func:`fsdp_gather`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import torch
import torch.nn as nn

from autoplan.errors import PlanError
from autoplan.types.graph import within
from autoplan.types.plan import Plan
from autoplan.types.runtime import fsdp_float8_all_gather

#: the environment variable that lets an fp8 plan run emulated on the CPU (tests only)
EMULATE_ENV = "AUTOPLAN_FP8_EMULATE"
#: FP8 GEMMs need both matrix dims divisible by this (torch._scaled_mm)
FP8_DIM_MULTIPLE = 16
#: the first CUDA compute capability with FP8 tensor cores (Ada Lovelace, sm_89)
FP8_MIN_CAPABILITY = (8, 9)
FP8_GPUS = "H100, H200, L40S, B200"


def emulated() -> bool:
    """True when ``AUTOPLAN_FP8_EMULATE=1`` lets fp8 run on the CPU (tests only)."""
    return os.environ.get(EMULATE_ENV, "") == "1"


def check_runs_here(plan: Plan) -> None:
    """Raise PlanError, in one sentence, when ``plan`` asks for fp8 where it cannot run: no
    CUDA device (unless emulated), a GPU without FP8 tensor cores, or torchao missing."""
    if plan.precision != "fp8":
        return
    need = (
        f"plan precision fp8 needs a CUDA GPU with FP8 tensor cores (compute capability "
        f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}+: {FP8_GPUS})"
    )
    if not torch.cuda.is_available():
        if not emulated():
            raise PlanError(f"{need}; this run is on CPU: re-plan with --fix precision=bf16.")
    elif torch.cuda.get_device_capability() < FP8_MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability()
        raise PlanError(
            f"{need}; this run is on {torch.cuda.get_device_name()} (compute capability {major}.{minor}): "
            "re-plan with --fix precision=bf16."
        )
    if plan.fp8_recipe_used == "rowwise" and plan.tp > 1:
        raise PlanError(
            f"plan fp8_recipe=rowwise with tp={plan.tp}: torchao's float8 tensor-parallel styles scale per tensor "
            "only; use fp8_recipe=tensorwise or tp=1."
        )
    if importlib.util.find_spec("torchao") is None:
        raise PlanError(
            "plan precision fp8 runs on torchao's float8 training, which is not installed here: "
            "pip install torchao (or re-plan with --fix precision=bf16)."
        )


def _torchao_float8():
    """``torchao.float8``, imported with torchao's import-time warnings about optional CUDA
    kernels it cannot load on this machine kept quiet (they do not concern float8 training)."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        logger.setLevel(level)
    return float8


def local_dims(*, module: nn.Linear, split: str, tp: int) -> tuple[int, int]:
    """(in_features, out_features) of this rank's shard of ``module`` under ``split``."""
    inp, out = module.in_features, module.out_features
    if tp > 1 and split == "colwise":
        out //= tp
    if tp > 1 and split == "rowwise":
        inp //= tp
    return inp, out


def eligible(*, module: nn.Module, split: str = "replicate", tp: int = 1) -> bool:
    """Whether ``module`` runs in fp8: an ``nn.Linear`` whose local dims divide by 16."""
    if not isinstance(module, nn.Linear) or is_float8(module):  # Float8Linear is an nn.Linear: once is enough
        return False
    return all(d % FP8_DIM_MULTIPLE == 0 for d in local_dims(module=module, split=split, tp=tp))


def eligible_fqns(model: nn.Module, plan: Plan, *, exclude: tuple[str, ...] = ()) -> list[str]:
    """The FQNs of ``model``'s linears that run in fp8 under ``plan`` (none unless its precision
    is fp8), leaving out those under a prefix in ``exclude`` (expert modules, which expert
    parallelism slices: not converted)."""
    if plan.precision != "fp8":
        return []
    return [
        fqn
        for fqn, module in model.named_modules()
        if eligible(module=module, split=plan.tp_plan.get(fqn, "replicate"), tp=plan.tp)
        and not any(within(fqn, p) for p in exclude)
    ]


def fsdp_gather(plan: Plan) -> bool:
    """Whether FSDP2 gathers the converted weights in FP8 here (types/runtime.py ``fsdp_float8_all_gather``:
    ZeRO-3, tensorwise, on NCCL; the cost model's dp statement prices the same rule)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"  # the executor's process-group backend
    return fsdp_float8_all_gather(
        runtime=plan.runtime,
        zero_stage=plan.zero_stage,
        precision=plan.precision,
        recipe=plan.fp8_recipe_used,
        backend=backend,
    )


def float8_config(recipe: str, *, fsdp_gather: bool = False) -> Any:
    """torchao's ``Float8LinearConfig`` of an autoplan recipe (module docstring), with its FP8 all-gather
    under FSDP2 when ``fsdp_gather`` (tensorwise only)."""
    float8 = _torchao_float8()
    if recipe == "rowwise":
        return float8.Float8LinearConfig.from_recipe_name("rowwise")
    if recipe != "tensorwise":
        raise PlanError(f"fp8 recipe '{recipe}' is not torchao's; autoplan's executor runs tensorwise and rowwise.")
    return float8.Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_gather)


def convert_linears(
    module: nn.Module, fqns: list[str], *, recipe: str = "tensorwise", fsdp_gather: bool = False
) -> list[str]:
    """Swap the linears of ``module`` (the whole model or one pipeline stage; FQNs as in the
    model) named in ``fqns`` (:func:`eligible_fqns`) for torchao's ``Float8Linear``, in place,
    with ``recipe``'s config (``convert_to_float8_training``; FP8 all-gather under FSDP2 when
    ``fsdp_gather``, :func:`fsdp_gather`); return the FQNs converted here.
    Weights and ties are kept: ``Float8Linear.from_float`` reuses the Linear's Parameters."""
    present = dict(module.named_modules())
    mine = [fqn for fqn in fqns if fqn in present]
    if not mine:
        return []
    for fqn in mine:
        _as_linear(module, fqn, present[fqn])
    float8 = _torchao_float8()
    wanted = set(mine)
    float8.convert_to_float8_training(
        module, module_filter_fn=lambda _m, fqn: fqn in wanted, config=float8_config(recipe, fsdp_gather=fsdp_gather)
    )
    return mine


def _as_linear(root: nn.Module, fqn: str, module: nn.Module) -> None:
    """Make the module at ``fqn`` a plain ``nn.Linear`` again if the pipeline split turned it
    into a graph module (``InterpreterModule``, called with the input only), on its own Parameters."""
    if isinstance(module, nn.Linear):
        return
    weight, bias = module.get_parameter("weight"), getattr(module, "bias", None)
    with torch.device("meta"):
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight, linear.bias = weight, bias
    parent, _, name = fqn.rpartition(".")
    root.get_submodule(parent).register_module(name, linear)


def is_float8(module: nn.Module) -> bool:
    """Whether ``module`` is a torchao ``Float8Linear`` (without importing torchao otherwise)."""
    return type(module).__name__ == "Float8Linear" and type(module).__module__.startswith("torchao.")


def _style(split: str) -> Any:
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    return Float8ColwiseParallel if split == "colwise" else Float8RowwiseParallel


def tp_input(*, module: nn.Module, split: str, x: Any, placement: Any, mesh: Any) -> Any:
    """A converted linear's input under tensor parallelism: ``x`` (a DTensor) redistributed to
    ``placement`` in its own dtype (fp32 on autocast's fp32 residual stream, bf16 where the weights
    are cast), then cast to fp8 with its global tensorwise scale (torchao's style input function).
    torchao and torchtitan cast *before* the redistribution, so sequence parallelism's all-gather
    moves fp8 bytes; autoplan's cost model prices each tensor-parallel collective in its tensor's
    run dtype (cost/tp/collectives.py), so the executor casts after it: the same numbers (the scale
    is the global amax either way and a cast is element-wise), and gloo has no float8 dtypes."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    if tuple(x.placements) != (placement,):
        x = x.redistribute(mesh, [placement])
    return _style(split)._prepare_input_fn(tuple(x.placements), (placement,), module, (x,), mesh)


def tp_output(*, module: nn.Module, split: str, out: Any, placement: Any | None, mesh: Any) -> Any:
    """A converted linear's output under tensor parallelism: marked so that its gradient is cast
    to fp8 (e5m2) for the backward GEMMs (torchao's style output function), then redistributed
    to ``placement`` (None: kept) in the output's dtype, as :func:`tp_input` says why."""
    layouts = tuple(out.placements) if placement is None else (placement,)
    marked = _style(split)._prepare_output_fn(tuple(out.placements), False, module, out, mesh)
    return marked if tuple(marked.placements) == layouts else marked.redistribute(mesh, list(layouts))
