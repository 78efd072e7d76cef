"""A parallelization plan: what the planner picks and the executor runs.

A Plan is data, not live objects: searching and running are separate steps joined by a
saved ``plan.json`` (as in alpa's ``parallel_plan.py``). Its schema is versioned; see
docs/plan-format.md.

Mesh order is ``(pp, dp, tp)`` with tp innermost: ranks ``r`` and ``r+1`` share a tp group,
so tensor-parallel groups stay inside a node whenever ``tp`` divides the devices per node.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from autoplan.errors import PlanError
from autoplan.types import local_sgd
from autoplan.types._check import read_json, require, require_fields, require_known_fields, write_json_atomic
from autoplan.types.activation_offload import check_activation_offload
from autoplan.types.expert_layout import check_expert_layout
from autoplan.types.grad_compression import check_compression, topk_lossy
from autoplan.types.hsdp import check_dp_replicate
from autoplan.types.inputs import InputSpec
from autoplan.types.moe import MoEError, RoutingModel
from autoplan.types.moe_overlap import check_moe_a2a_overlap
from autoplan.types.offload import OFFLOADS, check_offload  # noqa: F401 (OFFLOADS: the plan's names)
from autoplan.types.overlaps import check_overlaps
from autoplan.types.plan_text import describe_plan
from autoplan.types.prediction import Prediction
from autoplan.types.recompute import check_recompute_blocks
from autoplan.types.runtime import Runtime, check_runtime_choices, runtime_named
from autoplan.types.schedule_steps import check_schedule_steps
from autoplan.types.schedules import SCHEDULES, check_schedule  # noqa: F401 (SCHEDULES: the plan's names)

PLAN_SCHEMA_VERSION = 1

RECOMPUTE = ("none", "selective", "full")
#: newer fields left out of plan.json at their (dataclass) default, so older plans and their files stay as they were
OMITTED_AT_DEFAULT = ("runtime", "compile", "fp8_recipe", "dp_replicate", "offload", "recompute_blocks", "expert_tp")
OMITTED_AT_DEFAULT += ("offload_activations", "moe_a2a_overlap", "sync_every", "outer_optimizer", "outer_lr")
OMITTED_AT_DEFAULT += ("outer_momentum", "topk_ratio", "schedule_steps")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
#: how context parallelism moves keys and values (docs/cost-model.md, "Context parallelism"): all-gather
#: them once per layer (Llama 3 section 3.3), pass them round the cp ring point to point (ring
#: attention; torch's "alltoall" rotation, Megatron's p2p), or all-to-all over heads (DeepSpeed-Ulysses)
CP_VARIANTS = ("allgather", "ring", "ulysses")
#: dtypes data-parallel gradients may travel and be summed in; below fp32 is lossy (``Plan.lossy``).
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
#: Tensor-parallel splits of one module, in torch.distributed.tensor.parallel's terms.
#: For an Embedding, "rowwise" splits the vocabulary and "colwise" the embedding dim.
#: "sequence_parallel" applies to norms and element-wise modules: shard the sequence dim.
SPLITS = ("replicate", "colwise", "rowwise", "sequence_parallel")


def plan_json(path: str | Path) -> Path:
    """A plan as a user names it, a ``plan.json`` or the plan folder holding one (``autoplan plan
    --out DIR``), as the plan.json path (which may not exist: the caller says so)."""
    path = Path(path)
    return path / "plan.json" if path.is_dir() else path


def runs_ddp(*, dp: int, tp: int, pp: int, zero_stage: int, overlap_grad_reduce: bool = True) -> bool:
    """Whether the executor realises data parallelism with PyTorch DDP (autoplan/execute/
    data_parallel.py ``dp_mode``): dp > 1, ZeRO-0, no tp or pp, the reduction overlapped. Only then
    do gradients live through the step as DDP's buckets, and only then can a DDP communication
    hook (PowerSGD) run; the cost model, the search and the executor all ask this one rule."""
    return dp > 1 and zero_stage == 0 and tp == 1 and pp == 1 and overlap_grad_reduce


def flat_grads(*, dp: int, tp: int, zero_stage: int, runs_ddp: bool) -> bool:
    """Whether the executor holds the gradients as views of one persistent flat fp32 buffer that the
    reduction reads in place (autoplan/execute/flat_grads.py): ZeRO-1 and the explicit all-reduce over
    dp > 1 ranks, with plain (not tensor-parallel DTensor) parameters. Then the gradients live through
    the whole step, and the reduction makes no flat copy of them."""
    return dp > 1 and zero_stage <= 1 and not runs_ddp and tp == 1


@dataclass
class Plan:
    """One hybrid data/tensor/pipeline plan.

    ``stages[i]`` lists the block FQNs that pipeline stage ``i`` runs, in order (with
    interleaving, ``pp * virtual_stages`` chunks, chunk ``c`` on stage ``c % pp``: types/layout.py). Modules
    outside every block go to the first stage (those before the first block) or the last (those after).
    ``tp_plan`` maps a module FQN to one of :data:`SPLITS`; a module not named is replicated.
    ``precision`` "fp8" runs every eligible ``nn.Linear`` (both dims divisible by 16) in FP8 with
    dynamic tensorwise scaling (torchao's float8 training) and everything else as bf16 does.
    ``grad_reduce_dtype`` is the dtype data-parallel gradients travel and are summed in: fp32 (as
    Megatron-LM does for bf16), or bf16/fp16, which halves the bytes and rounds the sum (lossy);
    the cost model prices and the executor runs that dtype.
    ``grad_compression="powersgd"`` compresses each gradient matrix to rank ``powersgd_rank``
    with error feedback (Vogels et al. 2019; torch's DDP ``powerSGD_hook``): lossy, and only
    where the executor runs DDP (dp > 1, tp = pp = ep = 1, ZeRO 0, overlapped reduction, fp32
    reduction). :attr:`lossy` names the lossy choices; the planner makes them only when allowed.
    ``overlap_grad_reduce=False`` all-reduces data-parallel gradients after the backward instead
    of under it (DDP's bucketed overlap): how Megatron-LM ran before 2023, and what its
    published runs are priced with; the executor then uses its explicit all-reduce.
    ``overlap_param_gather`` runs ZeRO-1/2's all-gather of the updated weights under the next
    step's first forward, bucket by bucket ahead of the block that needs it (Megatron-LM's
    ``--overlap-param-gather`` with its distributed optimizer); false (the default) gathers after
    the optimizer step. The planner offers it beside ZeRO-1 plans without experts and the executor
    runs those (autoplan/execute/param_gather.py); under ZeRO-2 it comes only from a Megatron-LM
    config read back (``explain --config``), priced as Megatron runs it (autoplan/cost/dp/sync.py).
    ``tp_comm_overlap`` hides the sequence-parallel all-gathers and reduce-scatters under the
    matmuls beside them by decomposing both into tp steps (PyTorch's async tensor parallelism,
    Megatron-Core's ``--tp-comm-overlap``); it needs sequence parallelism, and the executor runs
    it only on CUDA devices with NCCL (autoplan/cost/tp/overlap.py prices it).
    ``ep`` is the expert-parallel degree of a Mixture-of-Experts model: each MoE layer's routed
    experts are split over ``ep`` ranks, folded over the data-parallel ranks (at tp = 1 ``ep`` divides
    ``dp``; consecutive dp ranks form an ep group), and tokens reach their experts by
    all-to-all (docs/moe.md). Dense parameters stay replicated (or ZeRO-sharded) over all
    ``dp`` ranks; an expert's parameters over the edp ranks that hold it. ``expert_tp`` splits each
    local expert's FFN; with ``ep`` it lays the experts out as ``expert_tp x ep x edp`` over the stage's
    ``dp x cp x tp`` ranks (MoE Parallel Folding: autoplan/types/expert_layout.py).
    ``cp`` is the context-parallel degree: every sequence is split over ``cp`` ranks, which hold the
    same weights (gradients sync over dp x cp) and exchange keys and values in attention by
    ``cp_variant`` (:data:`CP_VARIANTS`); each rank holds two chunks of the sequence, head and tail
    (chunks r and 2cp-1-r), so causal attention costs every rank the same. The mesh is
    ``(pp, dp, cp, tp)`` (autoplan/types/layout.py), as torchtitan and Megatron-Core order it.
    ``runtime`` names the software the plan is priced for (autoplan/types/runtime.py: autoplan's
    executor, megatron, torchtitan, deepspeed); ``autoplan run`` runs only ``autoplan`` plans, the
    others are for ``export``. ``compile`` compiles each block with torch.compile (as torchtitan
    does), so its element-wise ops run fused. ``fp8_recipe`` is the FP8 scaling recipe
    (:data:`~autoplan.types.runtime.FP8_RECIPES`), '' for the runtime's default.
    ``dp_replicate`` splits dp into ``dp_replicate`` x ``dp / dp_replicate`` (HSDP): ZeRO shards over the
    ``dp / dp_replicate`` consecutive dp ranks of a shard group and replicates across the groups
    (types/hsdp.py; FSDP2 on a 2-D mesh, torchtitan's ``data_parallel_replicate_degree``).
    ``recompute_blocks`` budgets recompute: per pipeline chunk, how many of its first blocks run
    ``recompute``, the others none ([] = every block; autoplan/types/recompute.py).
    ``offload`` holds model states in host memory (:data:`OFFLOADS`, autoplan/types/offload.py): "optimizer"
    the fp32 master and Adam step (ZeRO-Offload, on ZeRO-1), "full" also the weights and gradients (FSDP2's
    CPUOffloadPolicy, on ZeRO-3); docs/cost-model.md, "Offload"; ``offload_activations``: types/activation_offload.py.
    ``moe_a2a_overlap`` runs the EP all-to-all beside another micro-batch's compute (types/moe_overlap.py).
    ``schedule_steps`` k runs the m micro-batches as k pipeline schedule steps of m / k (types/schedule_steps.py).
    ``routing`` is the routing model the plan was priced under (None for a dense model), so
    that run and calibrate re-trace the model as the planner did.
    ``model_sha256`` and ``graph_signature`` record what the plan was made for: the model file's
    SHA-256 and the traced graph's signature (:func:`autoplan.types.graph.parameters_signature`:
    its parameters' names, shapes and dtypes). ``run``, ``launch`` and ``export`` refuse a model
    of another signature and warn when only the file changed (trace/identity.py); a plan written
    before they existed has them empty and is not checked.
    ``inputs`` are the forward() arguments the model was traced with, shapes and dtypes only
    (:class:`autoplan.types.inputs.InputSpec`), so ``parallelize`` can build a micro-batch for a
    pipeline split without being given one; empty in plans made from a graph without them.
    ``predicted`` is what the planner predicted (:class:`autoplan.types.prediction.Prediction`),
    None for a plan nobody priced; a mapping given here (plan.json's object) is read into one.
    """

    devices: int
    dp: int
    tp: int
    pp: int
    micro_batch_size: int
    num_microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    precision: str = "fp32"
    grad_reduce_dtype: str = "fp32"
    grad_compression: str = "none"
    powersgd_rank: int = 0
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    ep: int = 1
    cp: int = 1
    cp_variant: str = "allgather"
    runtime: str = "autoplan"
    compile: bool = False
    fp8_recipe: str = ""
    dp_replicate: int = 1
    recompute_blocks: list[int] = field(default_factory=list)
    offload: str = "none"
    expert_tp: int = 1
    offload_activations: bool = False
    moe_a2a_overlap: bool = False
    sync_every: int = 1  # local SGD / DiLoCo (types/local_sgd.py)
    outer_optimizer: str = "average"
    outer_lr: float = local_sgd.DILOCO_OUTER_LR
    outer_momentum: float = local_sgd.DILOCO_OUTER_MOMENTUM
    topk_ratio: float = 0.0
    schedule_steps: int = 1  # pipeline schedule steps per optimizer step (types/schedule_steps.py)
    routing: RoutingModel | None = None
    stages: list[list[str]] = field(default_factory=list)
    tp_plan: dict[str, str] = field(default_factory=dict)
    model: str = ""
    model_sha256: str = ""
    graph_signature: str = ""
    profile: str = ""
    inputs: list[InputSpec] = field(default_factory=list)
    predicted: Prediction | None = None
    version: int = PLAN_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if isinstance(self.routing, dict):
            try:
                self.routing = RoutingModel.from_dict(self.routing) if self.routing else None
            except MoEError as exc:
                raise PlanError(f"plan routing: {exc}") from exc
        if not isinstance(self.inputs, list):  # messages are built only on failure: the search builds many plans
            raise PlanError(f"plan inputs={self.inputs!r}; expected a list.")
        try:
            self.inputs = [s if isinstance(s, InputSpec) else InputSpec.from_dict(s) for s in self.inputs]
        except PlanError as exc:
            raise PlanError(f"plan {exc}") from None
        if isinstance(self.predicted, dict):
            self.predicted = Prediction.from_dict(self.predicted) if self.predicted else None
        if not (self.predicted is None or isinstance(self.predicted, Prediction)):
            raise PlanError(f"plan predicted={self.predicted!r}; expected a Prediction, a mapping or nothing.")
        self._check_degrees()
        self._check_choices()
        self._check_stages()
        self._check_recompute_blocks()

    def _check_degrees(self) -> None:
        for name in ("devices", "dp", "tp", "pp", "ep", "cp", "micro_batch_size", "num_microbatches", "virtual_stages"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise PlanError(f"plan {name}={value!r}; expected an integer >= 1.")
        cp_name, cp_value = ("*cp", f" * cp={self.cp}") if self.cp > 1 else ("", "")
        if not (self.dp * self.cp * self.tp * self.pp == self.devices):
            raise PlanError(
                f"plan dp{cp_name}*tp*pp must equal devices: dp={self.dp}{cp_value} * tp={self.tp} * pp={self.pp} "
                f"= {self.dp * self.cp * self.tp * self.pp}, devices={self.devices}."
            )
        if not (self.cp == 1 or self.ep == 1):
            raise PlanError(
                f"plan cp={self.cp} with ep={self.ep}: context parallelism does not compose with expert parallelism "
                "yet; use cp=1 or ep=1."
            )
        check_expert_layout(self)
        if self.zero_stage not in (0, 1, 2, 3):
            raise PlanError(f"plan zero_stage={self.zero_stage!r}; expected 0, 1, 2 or 3.")

    def _check_choices(self) -> None:
        if self.cp_variant not in CP_VARIANTS:
            raise PlanError(f"plan cp_variant='{self.cp_variant}'; expected one of {', '.join(CP_VARIANTS)}.")
        check_schedule_steps(self)  # first: the schedule's rules read the micro-batches of one schedule step
        check_schedule(self)
        if self.recompute not in RECOMPUTE:
            raise PlanError(f"plan recompute='{self.recompute}'; expected one of {', '.join(RECOMPUTE)}.")
        if self.precision not in PRECISIONS:
            raise PlanError(f"plan precision='{self.precision}'; expected one of {', '.join(PRECISIONS)}.")
        if self.grad_reduce_dtype not in REDUCE_DTYPES:
            raise PlanError(
                f"plan grad_reduce_dtype='{self.grad_reduce_dtype}'; expected one of {', '.join(REDUCE_DTYPES)}."
            )
        local_sgd.check_local_sgd(self)  # first: it changes which ranks run DDP, which PowerSGD's rule reads
        check_compression(self)
        check_dp_replicate(self)
        check_offload(self)
        check_activation_offload(self)
        check_moe_a2a_overlap(self)
        check_runtime_choices(
            runtime=self.runtime, compile=self.compile, precision=self.precision, fp8_recipe=self.fp8_recipe
        )
        if not {*SPLITS}.issuperset(getattr(self.tp_plan, "splits", None) or self.tp_plan.values()):  # FrozenTpPlan's
            module, split = next((module, split) for module, split in self.tp_plan.items() if split not in SPLITS)
            raise PlanError(f"plan tp_plan['{module}']='{split}'; expected one of {', '.join(SPLITS)}.")
        if self.sequence_parallel and self.tp <= 1:
            raise PlanError("plan sequence_parallel=true needs tp > 1.")
        check_overlaps(self)

    @property
    def runs_ddp(self) -> bool:
        """Whether the executor realises this plan's data parallelism with DDP (:func:`runs_ddp`)."""
        return runs_ddp(  # the dp x cp ranks hold the same weights and sync their gradients together
            dp=local_sgd.inner_dp(self) * self.cp,  # (within a replica only under local SGD)
            tp=self.tp,
            pp=self.pp,
            zero_stage=self.zero_stage,
            overlap_grad_reduce=self.overlap_grad_reduce,
        )

    @property
    def flat_grads(self) -> bool:
        """Whether the executor holds this plan's gradients in one flat buffer (:func:`flat_grads`)."""
        return flat_grads(
            dp=local_sgd.inner_dp(self) * self.cp, tp=self.tp, zero_stage=self.zero_stage, runs_ddp=self.runs_ddp
        )

    @property
    def runtime_preset(self) -> Runtime:
        """The :class:`~autoplan.types.runtime.Runtime` this plan is priced for."""
        return runtime_named(self.runtime)

    @property
    def fp8_recipe_used(self) -> str:
        """The FP8 recipe the runtime runs: ``fp8_recipe``, or the runtime's default when it is ''."""
        preset = self.runtime_preset
        return self.fp8_recipe or (preset.fp8_recipes[0] if preset.fp8_recipes else "")

    @property
    def lossy(self) -> list[str]:
        """The choices that change the gradient sum the optimizer sees (``--allow-lossy``)."""
        found = []
        if self.grad_reduce_dtype != "fp32":
            found.append(f"gradient reduction in {self.grad_reduce_dtype}")
        if self.grad_compression == "powersgd":
            found.append(f"PowerSGD rank {self.powersgd_rank}")
        found += [f"parameters averaged every {self.sync_every} steps"] if self.sync_every > 1 else []
        found += topk_lossy(self)
        return found

    def _check_stages(self) -> None:
        if not self.stages:
            return
        chunks = self.pp * self.virtual_stages
        if not (len(self.stages) == chunks):
            raise PlanError(f"plan has {len(self.stages)} stages; expected pp*virtual_stages = {chunks}.")
        flat = [layer for stage in self.stages for layer in stage]
        if not (len(flat) == len(set(flat))):
            raise PlanError("plan stages list a layer more than once.")

    def _check_recompute_blocks(self) -> None:
        chunks = self.pp * self.virtual_stages
        check_recompute_blocks(
            recompute=self.recompute, recompute_blocks=self.recompute_blocks, chunks=chunks, stages=self.stages
        )

    @classmethod
    def unchecked(cls, **values: Any) -> "Plan":
        """A Plan of ``values`` and the defaults, without ``__post_init__``'s checks: the search's candidates, most
        read only by a bound (solve/candidates.py:Group.plan); it runs :meth:`checked` on those it prices."""
        if not _REQUIRED <= values.keys() <= _NAMES:  # as __init__ would refuse them
            raise TypeError(f"Plan.unchecked() needs {', '.join(sorted(_REQUIRED))} and Plan fields only")
        plan = cls.__new__(cls)
        plan.__dict__.update(_DEFAULTS, **{name: make() for name, make in _FACTORIES if name not in values} | values)
        return plan

    def checked(self) -> "Plan":
        """This plan, after the checks every built Plan passes (``__post_init__``)."""
        return self.__post_init__() or self

    # ---- derived -----------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        return self.dp * self.micro_batch_size * self.num_microbatches

    def describe(self) -> str:
        """A one-line human summary, e.g. ``dp=4 tp=2 pp=1 mbs=2x4 1f1b zero=1 rc=none bf16`` (types/plan_text.py)."""
        return describe_plan(self)

    # ---- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["predicted"] = self.predicted.to_dict() if self.predicted else {}
        data["routing"] = self.routing.to_dict() if self.routing else None
        data["inputs"] = [spec.to_dict() for spec in self.inputs]
        if not data["inputs"]:
            del data["inputs"]  # plan files without traced inputs stay as they were
        if self.cp == 1:
            del data["cp"], data["cp_variant"]  # and so do plans without context parallelism
        for known in fields(self):
            if known.name in OMITTED_AT_DEFAULT and data[known.name] == _default(known):
                del data[known.name]  # and plans for autoplan's executor, uncompiled, with the default FP8 recipe
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        require_fields(data, ("devices", "dp", "tp", "pp", "micro_batch_size", "num_microbatches"), PlanError, "plan")
        version = data.get("version", PLAN_SCHEMA_VERSION)
        require(
            version == PLAN_SCHEMA_VERSION,
            PlanError,
            f"plan schema version {version} is not supported; expected {PLAN_SCHEMA_VERSION}.",
        )
        require_known_fields(data, cls, PlanError, "plan")
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_dict(read_json(path, PlanError, "plan"))


def _default(known: Any) -> Any:
    """A dataclass field's default value (its factory's product for a list or dict)."""
    return known.default_factory() if known.default is MISSING else known.default


#: Plan.unchecked's defaults: each field's value, or the factory that makes a fresh list or dict, or neither
_DEFAULTS = {known.name: known.default for known in fields(Plan) if known.default is not MISSING}
_FACTORIES = [(known.name, known.default_factory) for known in fields(Plan) if known.default_factory is not MISSING]
_NAMES = frozenset(known.name for known in fields(Plan))
_REQUIRED = _NAMES - set(_DEFAULTS) - {name for name, _ in _FACTORIES}
