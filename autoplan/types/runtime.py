"""The runtime a plan is priced for: the software that will run it, and what that software fuses.

autoplan's own executor runs the user's model code as written. Megatron-Core, torchtitan and
DeepSpeed run the same layout with their own kernels and overlaps, so the same plan takes another
time under each. A :class:`Runtime` names those differences as switches the cost model reads
(docs/cost-model.md, "Runtimes"); :data:`RUNTIMES` holds the presets, each switch with its source.
A plan carries its runtime's name (``Plan.runtime``); ``autoplan run`` runs only ``autoplan`` plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import PlanError

#: FP8 scaling recipes: torchao's dynamic tensorwise and rowwise (torchao/float8/config.py), and
#: Transformer Engine's delayed and current (per-tensor) scaling (transformer_engine/common/recipe).
FP8_RECIPES = ("tensorwise", "rowwise", "te_delayed", "te_current")


@dataclass(frozen=True)
class Runtime:
    """What one training runtime does that the traced eager ops do not say.

    ``fused_attention``: attention written as eager ops in the model (scores materialised) runs as
    one fused kernel (the runtime brings its own attention module). ``fused_elementwise``:
    element-wise ops are fused whatever ``Plan.compile`` says (Transformer Engine's fused norms,
    bias-GeLU and casts). ``grad_accumulation_fusion``: the weight-gradient GEMM accumulates into
    the fp32 gradient buffer, so no separate accumulation pass. ``pp_scatter_gather``: under TP a
    pipeline send carries 1/tp of the boundary tensor per rank, all-gathered on arrival.
    ``compile``: whether ``Plan.compile`` means anything to it. ``fp8_recipes``: the recipes it
    runs, its default first. ``attention_kernel``: whose fused attention kernel runs an attention:
    ``sdpa`` (PyTorch's SDPA, FlashAttention-2 on CUDA) or ``te`` (Transformer Engine's, cuDNN on
    Hopper); the profile's ``attention`` or ``attention_te`` curves price it.
    """

    name: str
    fused_attention: bool
    fused_elementwise: bool
    grad_accumulation_fusion: bool
    pp_scatter_gather: bool
    compile: bool
    fp8_recipes: tuple[str, ...]
    source: str
    attention_kernel: str = "sdpa"

    def check_fp8_recipe(self, recipe: str) -> None:
        """Refuse a recipe this runtime does not run (one sentence)."""
        if recipe not in FP8_RECIPES:
            raise PlanError(f"plan fp8_recipe='{recipe}'; expected one of {', '.join(FP8_RECIPES)}.")
        if recipe not in self.fp8_recipes:
            raise PlanError(
                f"plan fp8_recipe='{recipe}' with runtime '{self.name}': it runs {', '.join(self.fp8_recipes)}; "
                "pick one of those or another runtime."
            )


RUNTIMES: dict[str, Runtime] = {
    "autoplan": Runtime(
        name="autoplan",
        fused_attention=False,
        fused_elementwise=False,
        grad_accumulation_fusion=False,
        pp_scatter_gather=False,
        compile=True,
        fp8_recipes=("tensorwise", "rowwise"),
        source="autoplan/execute: the model's code as written, torchao float8 linears, torch.compile per block",
    ),
    "megatron": Runtime(
        name="megatron",
        fused_attention=True,
        fused_elementwise=True,
        grad_accumulation_fusion=True,
        pp_scatter_gather=True,
        compile=False,
        fp8_recipes=("te_current", "te_delayed"),
        attention_kernel="te",
        source="Megatron-Core with Transformer Engine: --gradient-accumulation-fusion, scatter/gather pipeline "
        "sends (Narayanan et al. SC'21 section 4.1), TE fused attention and fused norm/activation/cast kernels",
    ),
    "torchtitan": Runtime(
        name="torchtitan",
        fused_attention=True,
        fused_elementwise=False,
        grad_accumulation_fusion=False,
        pp_scatter_gather=False,
        compile=True,
        fp8_recipes=("tensorwise", "rowwise"),
        source="torchtitan: its own model code (SDPA / flex attention), torch.compile per block "
        "(compile.enable), torchao float8 (float8.recipe_name)",
    ),
    "deepspeed": Runtime(
        name="deepspeed",
        fused_attention=False,
        fused_elementwise=False,
        grad_accumulation_fusion=False,
        pp_scatter_gather=False,
        compile=False,
        fp8_recipes=(),
        source="DeepSpeed ZeRO: the model's code as written, fp32 gradient accumulation in its own buffers",
    ),
}


def runtime_named(name: str) -> Runtime:
    """The preset called ``name``; a PlanError naming the choices otherwise."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise PlanError(f"plan runtime='{name}'; expected one of {', '.join(RUNTIMES)}.") from None


def check_runtime_choices(*, runtime: str, compile: bool, precision: str, fp8_recipe: str) -> None:
    """Refuse a plan whose compile or FP8 recipe its runtime does not run (one sentence each)."""
    preset = runtime_named(runtime)
    if compile and not preset.compile:
        raise PlanError(
            f"plan compile=true with runtime '{runtime}': it does not compile blocks with torch.compile "
            "(its element-wise fusion is its own); use compile=false."
        )
    if not fp8_recipe:
        return  # the runtime's default
    if precision == "fp8":
        preset.check_fp8_recipe(fp8_recipe)
    elif fp8_recipe not in FP8_RECIPES:
        raise PlanError(f"plan fp8_recipe='{fp8_recipe}'; expected one of {', '.join(FP8_RECIPES)}.")
