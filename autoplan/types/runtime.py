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


def fsdp_float8_all_gather(*, runtime: str, zero_stage: int, precision: str, recipe: str, backend: str) -> bool:
    """Whether FSDP2 all-gathers FP8 linears' weights in FP8 (torchao's ``enable_fsdp_float8_all_gather``,
    1 byte per weight instead of 2): autoplan's executor, which enables it (execute/float8.py; torchtitan
    leaves it off by default and autoplan's export does not set it), under ZeRO-3 with fp8 ``tensorwise``
    (torchao offers it for no other recipe) on NCCL (gloo has no float8 dtypes: "Invalid scalar type").
    cost/dp/messages.py states its bytes by the same rule."""
    fp8 = precision == "fp8" and recipe == "tensorwise"
    return runtime == "autoplan" and zero_stage == 3 and fp8 and backend == "nccl"


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
    runs, its default first. ``grad_buffer_dtype``: the dtype gradients accumulate in across
    micro-batches, ``fp32`` or ``reduce`` (the plan's ``grad_reduce_dtype``: Megatron's main_grad
    buffer, fp32 only with ``--accumulate-allreduce-grads-in-fp32`` / ``grad_reduce_in_fp32``).
    ``fusion_needs_fp32_buffer``: the fused weight-gradient GEMM accumulates only into an fp32
    buffer (Megatron-LM until 2022-09, arguments.py turned the fusion off otherwise).
    ``attention_kernel``: whose fused attention kernel runs an attention: ``sdpa`` (PyTorch's SDPA,
    FlashAttention-2 on CUDA) or ``te`` (Transformer Engine's, cuDNN on Hopper); the profile's
    ``attention`` or ``attention_te`` curves price it.
    """

    name: str
    fused_attention: bool
    fused_elementwise: bool
    grad_accumulation_fusion: bool
    pp_scatter_gather: bool
    compile: bool
    fp8_recipes: tuple[str, ...]
    source: str
    grad_buffer_dtype: str = "fp32"
    fusion_needs_fp32_buffer: bool = False
    attention_kernel: str = "sdpa"

    def fuses_accumulation(self, grad_reduce_dtype: str) -> bool:
        """Whether the weight-gradient GEMM accumulates into the gradient buffer itself (no separate
        pass) for a plan reducing gradients in ``grad_reduce_dtype``."""
        fp32_buffer = self.grad_buffer_dtype == "fp32" or grad_reduce_dtype == "fp32"
        return self.grad_accumulation_fusion and (fp32_buffer or not self.fusion_needs_fp32_buffer)

    def buffer_dtype(self, grad_reduce_dtype: str) -> str:
        """The dtype gradients accumulate in across micro-batches under this runtime."""
        return grad_reduce_dtype if self.grad_buffer_dtype == "reduce" else "fp32"

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
        pp_scatter_gather=True,
        compile=True,
        fp8_recipes=("tensorwise", "rowwise"),
        source="autoplan/execute: the model's code as written, torchao float8 linears, torch.compile per block, "
        "scatter/gather pipeline sends under TP (execute/pipeline_scatter.py)",
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
        "sends (Narayanan et al. SC'21 section 4.1), TE fused attention and fused norm/activation/cast kernels; "
        "gradients accumulate and reduce in the parameter dtype (grad_reduce_in_fp32 off by default)",
        grad_buffer_dtype="reduce",
    ),
    "megatron-lm-2022": Runtime(
        name="megatron-lm-2022",
        fused_attention=False,
        fused_elementwise=True,
        grad_accumulation_fusion=True,
        pp_scatter_gather=True,
        compile=False,
        fp8_recipes=(),
        source="Megatron-LM of Narayanan et al. SC'21 and Korthikanti et al. 2022: attention as unfused matmuls "
        "(no flash attention), fused scale-mask-softmax, bias-GeLU, bias-dropout-add and LayerNorm kernels, "
        "scatter/gather pipeline sends; main_grad in the reduce dtype (fp32 only with "
        "--accumulate-allreduce-grads-in-fp32, forced for bf16); --gradient-accumulation-fusion from NVIDIA/"
        "Megatron-LM 83b1e42 (2022-02-13), only with fp32 accumulation until 07916bf (2022-09-27)",
        grad_buffer_dtype="reduce",
        fusion_needs_fp32_buffer=True,
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


#: the ``autoplan export --to`` target that runs each runtime's plans (autoplan runs its own)
EXPORT_TARGETS = {
    "megatron": "megatron",
    "megatron-lm-2022": "megatron",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
}


def check_runs_on_autoplan(runtime: str) -> None:
    """Refuse, in one sentence, to run or launch a plan priced for another runtime: its price assumes
    that runtime's kernels and overlaps, which autoplan's executor does not run."""
    if runtime == "autoplan":
        return
    target = EXPORT_TARGETS.get(runtime, runtime)
    raise PlanError(
        f"this plan is priced for {runtime}; export it with `autoplan export --to {target}`, or plan again with "
        "--runtime autoplan."
    )


def check_runtime_choices(*, runtime: str, compile: bool, precision: str, fp8_recipe: str) -> None:
    """Refuse a plan whose compile or FP8 recipe its runtime does not run (one sentence each)."""
    preset = runtime_named(runtime)
    if compile and not preset.compile:
        raise PlanError(
            f"plan compile=true with runtime '{runtime}': it does not compile blocks with torch.compile "
            "(its element-wise fusion is its own); use compile=false."
        )
    if precision == "fp8" and not preset.fp8_recipes:
        runs = ", ".join(name for name, other in RUNTIMES.items() if other.fp8_recipes)
        raise PlanError(
            f"plan precision=fp8 with runtime '{runtime}': it runs no FP8 recipe autoplan prices; use bf16, or "
            f"one of the runtimes {runs}."
        )
    if not fp8_recipe:
        return  # the runtime's default
    if precision == "fp8":
        preset.check_fp8_recipe(fp8_recipe)
    elif fp8_recipe not in FP8_RECIPES:
        raise PlanError(f"plan fp8_recipe='{fp8_recipe}'; expected one of {', '.join(FP8_RECIPES)}.")
