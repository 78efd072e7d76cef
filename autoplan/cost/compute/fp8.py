"""FP8 linears' price per scaling recipe: which linears run FP8 GEMMs, the bytes their casts move and
the GEMM's peak (the discussion: docs/cost-model.md, "FP8 recipes"). With M tokens, K in and N out
features, ``x = M K``, ``w = K N``, ``g = M N``, per micro-batch (bytes per element: bf16 2, fp8 1):

| recipe | forward | backward | once a step |
|---|---|---|---|
| tensorwise (torchao) | 5 (x + w) | 5 (2 g + w + x) + 2 (w + g + x) | |
| rowwise (torchao) | tensorwise's + 4 (M + N) | tensorwise's + 4 (M + N + 2 K) | |
| te_delayed (Transformer Engine) | 1 x | 4 g | 4 w |
| te_current (Transformer Engine) | 3 x | 6 g | 6 w |

torchao (torchao/float8/float8_linear.py, float8_ops.py): a cast reads the tensor for its amax (2),
reads it again and writes FP8 (2 + 1); the backward casts g twice and re-casts w and x from their
saved bf16 copies; each FP8 operand of a backward GEMM is copied to the layout ``_scaled_mm`` needs
(1 + 1). Rowwise adds one fp32 scale per row of each cast; its GEMM (a CUTLASS kernel, not cuBLAS)
runs at ``ROWWISE_GEMM_EFFICIENCY`` of the tensorwise GEMM's speed (pytorch/pytorch#147971).
Transformer Engine (Megatron-Core's FP8, TE's "Using FP8" guide): activations are cast inside the
norm or activation kernel that makes them, which writes the FP8 transpose the weight-gradient GEMM
reads (1 x); the output gradient is cast and transposed in one pass (read 2, write 1 + 1); a weight
is cast once a step (``is_first_microbatch``) into FP8 and its transpose (4 w); delayed scaling
takes its scale from the amax history, current scaling ("FP8-CS") reads each activation, gradient
and weight once more for its amax (+2 each). Per micro-batch a weight costs ``4 w / m`` (te_*).
The routed experts' grouped GEMMs run FP8 only under a runtime of :data:`FP8_EXPERT_RUNTIMES`, priced by
the same table with x, g the rows of every local expert and w all of their weights (:func:`cast_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.types.graph import OpNode
from autoplan.types.plan import Plan
from autoplan.types.runtime import FP8_RECIPES

FP8_ALIGN = 16  # torch._scaled_mm: every GEMM dim a multiple of 16
FP8_CAST_BYTES = 2 + 2 + 1  # per element, one torchao hp_tensor_to_float8_dynamic: amax read, cast read + FP8 write
FP8_LAYOUT_BYTES = 1 + 1  # per element, an FP8 operand copied to the layout _scaled_mm needs
SCALE_BYTES = 4  # one fp32 scale per row (rowwise)
#: rowwise-scaled _scaled_mm (CUTLASS) over tensorwise (cuBLAS) speed on H100: "most shapes are within
#: 90-100% of tensor-wise efficiency, but there's a long tail going down to 50%" (pytorch/pytorch#147971,
#: fast-accum); torchao's README training table agrees in direction (Llama3-8B on 8 H100: tensorwise
#: +25.0% over bf16, rowwise +10.1%).
ROWWISE_GEMM_EFFICIENCY = 0.9
TE_CAST_TRANSPOSE_BYTES = 2 + 1 + 1  # read bf16, write FP8 and its transpose (TE's fused cast-transpose)
TE_AMAX_BYTES = 2  # current scaling reads the tensor once more for its amax
TE_TRANSPOSE_BYTES = 1  # the FP8 transpose a fused norm/activation-cast kernel writes beside its output
#: runtimes whose FP8 covers the routed experts' grouped GEMMs, and why. Megatron-Core runs its experts as
#: Transformer Engine linears (TEGroupedMLP's GroupedLinear, or SequentialMLP's per-expert TE linears:
#: megatron/core/transformer/moe/experts.py) inside the fp8_autocast that covers every TE linear, so its FP8
#: reaches them as DeepSeek-V3's did (arXiv 2412.19437 section 3.3). autoplan's executor converts nn.Linear only
#: (execute/float8.py): torchao's FP8 grouped GEMM (torchao.prototype.moe_training) runs Triton kernels with no
#: emulated mode, so no gloo test could verify it; torchtitan runs it only under quantize.grouped_mm, which
#: autoplan's torchtitan export does not write. Their experts stay at the 16-bit peak.
FP8_EXPERT_RUNTIMES = {"megatron": "Transformer Engine's fp8_autocast covers the experts' TE linears"}
#: runtimes whose tensorwise FP8 under TP casts a linear's input and output gradient before their redistributions
#: (torchao's Float8ColwiseParallel, Float8RowwiseParallel and PrepareFloat8ModuleInput, which torchtitan's
#: float8 TP applies); autoplan's executor casts after them (execute/float8.py). Which amaxes each all-reduces:
#: cost/tp/amax.py.
TP_CAST_FIRST_RUNTIMES = {"torchtitan": "torchao/float8/float8_tensor_parallel.py, torchtitan's apply_tp"}


@dataclass(frozen=True)
class Fp8Recipe:
    """The recipe a plan's FP8 linears run (types/runtime.py ``FP8_RECIPES``), and the micro-batches
    of a step, over which Transformer Engine's once-a-step weight cast is shared (1 for torchao's)."""

    name: str = "tensorwise"
    micro_batches: int = 1
    experts: bool = False  # the grouped expert GEMMs run FP8 too (FP8_EXPERT_RUNTIMES)
    tp_cast_first: bool = False  # under TP, casts before the redistributions (TP_CAST_FIRST_RUNTIMES, cost/tp/amax.py)

    @classmethod
    def of(cls, *, recipe: str, num_microbatches: int, runtime: str = "autoplan") -> Fp8Recipe:
        """The priced recipe: ``recipe`` ('' is tensorwise), with the step's micro-batches for TE's, and
        whether ``runtime`` runs the grouped expert GEMMs in it."""
        recipe = recipe or "tensorwise"
        if recipe not in FP8_RECIPES:
            raise ValueError(f"fp8 recipe '{recipe}'; expected one of {', '.join(FP8_RECIPES)}")
        micro_batches = num_microbatches if recipe.startswith("te_") else 1
        cast_first = runtime in TP_CAST_FIRST_RUNTIMES and recipe == "tensorwise"
        return cls(recipe, micro_batches, runtime in FP8_EXPERT_RUNTIMES, tp_cast_first=cast_first)

    @property
    def transformer_engine(self) -> bool:
        return self.name.startswith("te_")

    @property
    def gemm_efficiency(self) -> float:
        """The FP8 GEMM's speed over the profile's FP8 curve (tensorwise's): module docstring."""
        return ROWWISE_GEMM_EFFICIENCY if self.name == "rowwise" else 1.0


TENSORWISE = Fp8Recipe()
#: the fastest an FP8 plan's experts can run, whatever its runtime: at the FP8 peak, tensorwise's GEMM speed (the
#: search's floor, cost/bounds.py, prices it without casts)
EXPERTS_FP8_FLOOR = Fp8Recipe(experts=True)


def fp8_recipe(plan: Plan, *, recipe: str = "") -> Fp8Recipe:
    """The recipe ``plan`` is priced with: ``recipe``, else its runtime's (``Plan.fp8_recipe_used``),
    when its precision is fp8; else tensorwise (no linear runs FP8, and block prices stay shared)."""
    if plan.precision != "fp8":
        return TENSORWISE
    return Fp8Recipe.of(
        recipe=recipe or plan.fp8_recipe_used, num_microbatches=plan.num_microbatches, runtime=plan.runtime
    )


def fp8_linear(node: OpNode, *, precision: str, shard: int = 1) -> bool:
    """Whether ``node`` runs as FP8 GEMMs under ``precision``: an nn.Linear (``tp_splittable`` not
    False) whose in and out features are both multiples of 16 * shard."""
    attrs = node.attrs
    if precision != "fp8" or node.op != "linear" or attrs.get("tp_splittable") is False:
        return False
    k, n = attrs.get("in_features"), attrs.get("out_features")
    align = FP8_ALIGN * max(1, shard)
    return isinstance(k, int) and isinstance(n, int) and k > 0 and n > 0 and k % align == 0 and n % align == 0


def fp8_cast_bytes(node: OpNode, *, batch_fraction: float, backward: bool, recipe: Fp8Recipe = TENSORWISE) -> float:
    """Bytes the recipe's scaling, casting and layout passes move for one FP8 linear's forward (or
    backward) on the traced batch times ``batch_fraction``, unsharded (module docstring's table)."""
    k, n = node.attrs["in_features"], node.attrs["out_features"]
    rows = math.prod(node.output_shape[:-1]) * batch_fraction
    return cast_bytes(rows=rows, k=k, n=n, weights=k * n, backward=backward, recipe=recipe)


def cast_bytes(*, rows: float, k: float, n: float, weights: float, backward: bool, recipe: Fp8Recipe) -> float:
    """The module docstring's table for ``rows`` rows of K in and N out features and ``weights`` weight
    elements: one linear (w = K N), or every local expert's grouped GEMM (w = G K N)."""
    x, g = rows * k, rows * n
    activations = _activation_bytes(recipe.name, x=x, g=g, backward=backward)
    if recipe.name == "rowwise":
        activations += SCALE_BYTES * (rows + n + (2 * k if backward else 0))
    return activations + _weight_bytes(weights, backward=backward, recipe=recipe)


def _activation_bytes(recipe: str, *, x: float, g: float, backward: bool) -> float:
    """The activation and gradient share of :func:`fp8_cast_bytes` (module docstring's table)."""
    amax = TE_AMAX_BYTES if recipe == "te_current" else 0
    if recipe.startswith("te_"):
        return (TE_CAST_TRANSPOSE_BYTES + amax) * g if backward else (TE_TRANSPOSE_BYTES + amax) * x
    if not backward:
        return FP8_CAST_BYTES * x
    return FP8_CAST_BYTES * (2.0 * g + x) + FP8_LAYOUT_BYTES * (g + x)


def weight_cast_bytes(node: OpNode, *, backward: bool, recipe: Fp8Recipe = TENSORWISE) -> float:
    """A weight's share of :func:`fp8_cast_bytes` per micro-batch: torchao's 5 w forward and 7 w
    backward; TE's once-a-step cast (4 w, 6 w with current scaling) over the step's micro-batches,
    charged to the forward."""
    w = float(node.attrs["in_features"] * node.attrs["out_features"])
    return _weight_bytes(w, backward=backward, recipe=recipe)


def _weight_bytes(w: float, *, backward: bool, recipe: Fp8Recipe) -> float:
    if recipe.transformer_engine:
        amax = TE_AMAX_BYTES if recipe.name == "te_current" else 0
        return 0.0 if backward else (TE_CAST_TRANSPOSE_BYTES + amax) * w / recipe.micro_batches
    return (FP8_CAST_BYTES + (FP8_LAYOUT_BYTES if backward else 0)) * w
