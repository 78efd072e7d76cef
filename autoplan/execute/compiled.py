"""``plan.compile`` as it runs: each block compiled with torch.compile, as torchtitan's
``apply_compile`` compiles each TransformerBlock (torchtitan/models/llama3/infra/parallelize.py).

One compile path serves the plan's ``compile`` and async TP (``tp_comm_overlap``, whose inductor
pass rewrites compiled blocks; execute/tp_overlap.py). Order (autoplan/execute/api.py, step 4):
after tensor parallelism and activation recomputation, so the compiled graph sees the DTensor
parameters and replays the checkpointed forward; before FSDP2/DDP, whose hooks stay outside it,
as torchtitan composes TP -> AC -> compile -> FSDP. It runs on every backend, CPU (gloo) included:
inductor's C++ backend there, Triton on CUDA. The cost model prices what inductor makes of the
block's element-wise ops as fused regions (autoplan/cost/compute/fusion.py); the audit counts the
kernels inductor generated (:func:`compiled_kernels`, execute/job/audit.py).

torch.compile compiles on the first call, so a failure comes from the first step; it is raised as
one sentence naming the block and the way out (``compile=false``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch
import torch.nn as nn

from autoplan.errors import PlanError

#: what a failure sentence tells the user to do, by the plan field that asked for compiled blocks
REMEDIES = {
    "compile": "set compile to false in the plan (or re-plan with --fix compile=off)",
    "tp_comm_overlap": "async TP needs compiled blocks: set tp_comm_overlap to false (or --fix tp_overlap=off)",
}


def compile_blocks(*, module: nn.Module, blocks: list[str], why: str = "compile") -> int:
    """Compile every block of ``blocks`` present in ``module`` (a block of another pipeline stage is
    absent); return how many. ``why`` (a key of :data:`REMEDIES`) names the plan field that asked."""
    present = dict(module.named_modules())
    mine = [fqn for fqn in blocks if fqn in present]
    for fqn in mine:
        block = present[fqn]
        block.compile()  # nn.Module.compile: torch.compile of the module's call, FQNs unchanged
        block._compiled_call_impl = _named_failure(block._compiled_call_impl, fqn=fqn, why=why)
    return len(mine)


def _named_failure(compiled, *, fqn: str, why: str):
    """``compiled``, with a torch.compile failure turned into one PlanError sentence."""

    @functools.wraps(compiled)
    def run(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise PlanError(
                f"torch.compile failed on block '{fqn}' ({type(error).__name__}: {first}); {REMEDIES[why]}."
            ) from error

    return run


#: a kernel definition in inductor's generated wrapper code (C++ on CPU, Triton on CUDA)
_KERNEL = re.compile(r"^\w+ = async_compile\.(cpp_pybinding|cpp|triton)\(", re.MULTILINE)


def compiled_kernels() -> tuple[int, int]:
    """(forward, backward) fused kernels inductor generated in this process so far: the kernel
    definitions in each distinct generated module (``torch._inductor.codecache.PyCodeCache``, which
    holds cache hits too), a module whose graph takes tangents being a backward. The audit compares
    the forward count with the fused regions the price assumed (cost/compute/fusion.py)."""
    from torch._inductor.codecache import PyCodeCache

    forward = backward = 0
    for path in {getattr(module, "__file__", None) for module in PyCodeCache.modules} - {None}:
        source = Path(path).read_text() if Path(path).is_file() else ""
        kernels = len(_KERNEL.findall(source))
        if "tangents_" in source:
            backward += kernels
        else:
            forward += kernels
    return forward, backward
