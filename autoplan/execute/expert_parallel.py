"""Expert parallelism (``plan.ep``): each MoE layer's routed experts split over ``ep`` ranks
(docs/executor.md, "Expert parallelism").

Groups: the dp axis is unflattened into ``(edp, ep)``, ep innermost (autoplan/execute/mesh.py):
dp rank ``d`` is ep rank ``d % ep`` of ep group ``d // ep``, and its edp group is the ``dp / ep``
ranks holding the same experts. Every experts-module parameter whose leading dimension is ``E``
holds this rank's ``E / ep`` experts, ``ep_rank * E / ep`` onwards; tokens reach them by
all-to-all (autoplan/execute/expert_dispatch.py). An expert's local gradient already sums its ep
group's tokens, so its gradient is

    g_e = (1 / dp) * SUM_{r in edp(e)} g_e^(r)

while dense parameters keep the mean over dp. :class:`ExpertParallel` realises it per dp mode: DDP
and the explicit all-reduce leave experts out and :meth:`ExpertParallel.sync_grads` all-reduces
them over edp and divides by dp; ZeRO-1 runs a second ``ShardedOptimizer`` over edp; FSDP2 averages
over edp and ``sync_grads`` multiplies by ``1 / ep``. A parameter shared by all experts keeps the
dense rule, and ZeRO-2/3 with one is refused.

Beside tp > 1 (MoE Parallel Folding, autoplan/types/expert_layout.py) the ep and edp groups come from the
folded ``(pp, edp, ep, etp)`` mesh over a stage's ``dp * tp`` ranks, so an ep group may span tp ranks: each
rank routes its own sequence shard (autoplan/execute/expert_sequence.py). The sliced experts are then
``Shard(0)`` DTensors on the ep mesh (``(ep, etp)`` at expert_tp > 1: execute/expert_tp.py), the ``[E, ...]``
tensor they are slices of (as torchtitan holds its experts), so TP and ``finalize_tp_grads`` leave them alone,
and one optimizer steps them beside the tp DTensors; their gradient is the rule above, over edp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from autoplan.errors import PlanError
from autoplan.execute.data_parallel import local
from autoplan.execute.ep_lanes import Lanes, second_groups
from autoplan.execute.expert_dispatch import ExpertsDispatch, install
from autoplan.execute.expert_tp import check_divides, etp_splits
from autoplan.trace.moe import experts_of, is_hf_experts
from autoplan.types.expert_layout import experts_apart
from autoplan.types.layout import EXPERT_TP_AXIS
from autoplan.types.plan import Plan


def find_experts(model: nn.Module) -> dict[str, ExpertsDispatch]:
    """One :class:`ExpertsDispatch` per experts module of ``model`` in the Hugging Face interface,
    by FQN (made before the model is split or sharded, from its eager modules)."""
    return {
        name: ExpertsDispatch(fqn=name, module=module)
        for name, module in model.named_modules()
        if is_hf_experts(module)
    }


def check_expert_parallel(*, model: nn.Module, plan: Plan, dispatches: dict[str, ExpertsDispatch]) -> None:
    """Raise PlanError, in one sentence, for an ``ep`` or ``expert_tp`` this model cannot run, or an experts'
    layout folded over tp ranks beside ZeRO-2/3 (types/expert_layout.py), which this executor does not run yet."""
    if plan.expert_tp > 1 and plan.tp == 1:
        raise PlanError(
            f"plan expert_tp={plan.expert_tp} at tp=1: autoplan's executor splits the experts' FFN over ranks of "
            "the tensor-parallel layout only (the search offers expert_tp dividing tp); plan expert_tp=1, or "
            "tp >= expert_tp with sequence parallelism."
        )
    if experts_apart(plan) and plan.tp > 1 and plan.zero_stage > 1:
        raise PlanError(
            f"plan ep={plan.ep}, expert_tp={plan.expert_tp} with tp={plan.tp}, zero_stage={plan.zero_stage}: "
            "autoplan's executor runs the experts' own layout beside tp > 1 at zero_stage 0 and 1 only; export this "
            "plan to Megatron-LM (autoplan export --to megatron), or re-plan with zero_stage 0 or 1 (or ep=1, "
            "expert_tp=1)."
        )
    if not experts_apart(plan):
        return
    for name, module in model.named_modules():
        found = experts_of(name, module)
        if found is not None and found[0] not in dispatches:
            raise PlanError(
                f"plan ep={plan.ep}, expert_tp={plan.expert_tp} needs Mixture-of-Experts layers in the Hugging Face "
                f"experts interface (docs/moe.md), but '{found[0]}' holds its experts as separate modules; plan ep=1 "
                "and expert_tp=1 for this model."
            )
    if not dispatches:
        raise PlanError(
            f"plan ep={plan.ep}, expert_tp={plan.expert_tp} but the model has no experts module in the Hugging Face "
            "experts interface (docs/moe.md) to split; plan ep=1 and expert_tp=1 for this model."
        )
    for name, dispatch in dispatches.items():
        if dispatch.num_experts % plan.ep:
            raise PlanError(
                f"plan ep={plan.ep} does not divide the {dispatch.num_experts} experts of '{name}'; "
                f"choose an ep that divides {dispatch.num_experts}."
            )
        if plan.expert_tp > 1:
            module = model.get_submodule(name)
            splits = etp_splits(module, dispatch.sharded, fqn=name)
            check_divides(splits, dict(module.named_parameters()), etp=plan.expert_tp, fqn=name)
        shared = [n for n in dispatch.names if n not in dispatch.sharded]
        if shared and plan.zero_stage >= 2:
            raise PlanError(
                f"plan ep={plan.ep} with ZeRO-{plan.zero_stage} cannot shard '{name}', whose parameter "
                f"'{shared[0]}' is shared by all its experts; plan zero_stage 0 or 1 for this model."
            )


@dataclass
class ExpertLayer:
    """One experts module of this rank's stage modules and the parameters sliced over ep."""

    fqn: str  # in the original model (stage modules keep FQNs)
    module: nn.Module  # the module in the stage that holds the parameters
    sharded: tuple[str, ...]


@dataclass
class ExpertParallel:
    """This rank's expert-parallel state: its groups and experts, and the gradient rule (module docstring)."""

    ep: int
    dp: int
    ep_mesh: DeviceMesh
    edp_mesh: DeviceMesh
    layers: list[ExpertLayer] = field(default_factory=list)
    #: folded over tp: the mesh the sliced experts are DTensors on, ``ep`` or ``(ep, etp)`` (module docstring)
    param_mesh: DeviceMesh | None = None
    etp_mesh: DeviceMesh | None = None  # expert_tp > 1: the ranks that split each expert's FFN (expert_tp.py)
    dispatches: list[ExpertsDispatch] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        """Original FQNs of the parameters sliced over ep."""
        return {f"{layer.fqn}.{name}" for layer in self.layers for name in layer.sharded}

    def parameters(self) -> list[nn.Parameter]:
        """The sliced parameters as the stage modules hold them now (FSDP2's DTensors once sharded)."""
        return [layer.module.get_parameter(name) for layer in self.layers for name in layer.sharded]

    def sync_grads(self, *, dp_mode: str, reduce_dtype: torch.dtype = torch.float32) -> None:
        """Give every expert parameter its gradient (module docstring), summed in ``reduce_dtype``
        (``plan.grad_reduce_dtype``, as the dense ones); ZeRO-1 reduces in its step."""
        params = self.parameters()
        if dp_mode == "fsdp":
            for param in params:
                if param.grad is not None:
                    local(param.grad).div_(self.ep)  # FSDP2 averaged over edp; the rule divides by dp
        elif dp_mode in ("ddp", "allreduce"):
            self._all_reduce(params, reduce_dtype)

    def _all_reduce(self, params: list[nn.Parameter], reduce_dtype: torch.dtype) -> None:
        group, by_dtype = self.edp_mesh.get_group(), {}
        for param in params:
            if param.grad is None:  # no token reached this rank's experts: a zero contribution
                param.grad = torch.zeros_like(param)
            by_dtype.setdefault(param.grad.dtype, []).append(local(param.grad))
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads]).to(reduce_dtype)
            if self.edp_mesh.size() > 1:
                dist.all_reduce(flat, group=group)
            flat /= self.dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def whole(self, tensor: torch.Tensor) -> torch.Tensor:
        """The whole ``[E, ...]`` tensor of one expert parameter as this rank holds it (a collective): a
        folded layout's ep DTensor gathered, else its ep slice (FSDP2's edp shards gathered first) gathered
        over the ep group."""
        if isinstance(tensor, DTensor) and self.folded(tensor):
            return tensor.full_tensor()
        return self.gather(tensor.full_tensor() if isinstance(tensor, DTensor) else tensor)

    def folded(self, tensor: DTensor) -> bool:
        """Whether ``tensor`` is an expert DTensor of a folded layout (on :attr:`param_mesh`)."""
        return self.param_mesh is not None and tensor.device_mesh.mesh_dim_names == self.param_mesh.mesh_dim_names

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The whole ``[E, ...]`` tensor from this ep group's ``[E / ep, ...]`` slices (a collective)."""
        parts = [torch.empty_like(tensor) for _ in range(self.ep)]
        dist.all_gather(parts, tensor.contiguous(), group=self.ep_mesh.get_group())
        return torch.cat(parts)


def apply_expert_parallel(
    *,
    modules: dict[int, nn.Module],
    plan: Plan,
    dispatches: dict[str, ExpertsDispatch],
    expert_mesh: DeviceMesh | None,
    eager: bool,
) -> ExpertParallel | None:
    """Slice the experts of this rank's stage ``modules`` over the ep group (and each one's FFN over the etp
    group, autoplan/execute/expert_tp.py) and make them route by all-to-all; None when the experts have no
    layout of their own (ep = expert_tp = 1). ``eager``: the stage modules are the eager model (pp = 1),
    whose experts modules get the dispatch as their forward; pipeline stages already call it
    (autoplan/execute/expert_dispatch.py, ``replace_experts_ops``). At tp > 1 (ep = 1) eager
    experts modules get it too: it runs them replicated on local tensors."""
    if not experts_apart(plan) or expert_mesh is None:
        for fqn, dispatch in dispatches.items() if eager and plan.tp > 1 else ():
            for stage in modules.values():
                if (module := _submodule(stage, fqn)) is not None:
                    install(module=module, dispatch=dispatch)
        return None
    ep_mesh, edp_mesh = expert_mesh["ep"], expert_mesh["edp"]
    folded = None  # at tp = 1 plain slices; beside tp the ep or (ep, etp) DTensors (module docstring)
    if plan.tp > 1:
        folded = expert_mesh["ep", EXPERT_TP_AXIS] if plan.expert_tp > 1 else ep_mesh
    etp_mesh = expert_mesh[EXPERT_TP_AXIS] if plan.expert_tp > 1 else None
    state = ExpertParallel(
        ep=plan.ep, dp=plan.dp, ep_mesh=ep_mesh, edp_mesh=edp_mesh, param_mesh=folded, etp_mesh=etp_mesh
    )
    etp_group = etp_mesh.get_group() if etp_mesh is not None else None
    # moe_a2a_overlap: a second ep group, so the overlapped pair's two halves each send on their own (ep_lanes.py)
    lanes = Lanes((ep_mesh.get_group(), second_groups(expert_mesh))) if plan.moe_a2a_overlap else None
    for fqn, dispatch in dispatches.items():
        dispatch.shard(group=ep_mesh.get_group(), etp_group=etp_group)
        dispatch.lanes = lanes
        state.dispatches.append(dispatch)
        for stage in modules.values():
            module = _submodule(stage, fqn)
            if module is None:
                continue
            splits = etp_splits(module, dispatch.sharded, fqn=fqn) if plan.expert_tp > 1 else {}
            _slice(module, dispatch, mesh=folded, splits=splits)
            if eager:
                install(module=module, dispatch=dispatch)
            state.layers.append(ExpertLayer(fqn=fqn, module=module, sharded=dispatch.sharded))
    return state


def _submodule(stage: nn.Module, fqn: str) -> nn.Module | None:
    try:
        return stage.get_submodule(fqn)
    except AttributeError:  # another pipeline stage holds it
        return None


@torch.no_grad()
def _slice(
    module: nn.Module, dispatch: ExpertsDispatch, *, mesh: DeviceMesh | None = None, splits: dict | None = None
) -> None:
    """Replace each per-expert parameter of ``module`` by this rank's ``E / ep`` experts, and of each its etp
    part by ``splits`` (autoplan/execute/expert_tp.py); with ``mesh`` (a folded layout) as the DTensor of the
    whole ``[E, ...]`` tensor on it: ``Shard(0)`` over ep, then the split's placement over etp."""
    per_rank = dispatch.num_experts // dispatch.ep
    start = dispatch.ep_rank * per_rank
    for name in dispatch.sharded:
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        full = owner.get_parameter(attr)
        mine = full[start : start + per_rank].clone()
        placements = [Shard(0)]
        if splits:
            mine = splits[name].local(mine, rank=dispatch.etp_rank, size=dispatch.etp)
            placements.append(splits[name].placement())
        if mesh is not None:
            mine = DTensor.from_local(mine, mesh, placements, run_check=False, shape=full.shape, stride=full.stride())
        owner.register_parameter(attr, nn.Parameter(mine, full.requires_grad))


def split_params(params: list[nn.Parameter], state: ExpertParallel | None) -> tuple[list, list]:
    """(dense, expert) parameters of ``params``, by identity."""
    if state is None:
        return list(params), []
    experts = {id(p) for p in state.parameters()}
    return [p for p in params if id(p) not in experts], [p for p in params if id(p) in experts]
