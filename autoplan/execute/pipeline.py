"""Pipeline stages from ``plan.stages`` and the schedule from ``plan.schedule`` (docs/executor.md,
"Pipeline parallelism").

``torch.distributed.pipelining.pipeline()`` exports the model with ``torch.export`` on one
micro-batch and cuts it at the first block FQN of every stage after the first
(``SplitPoint.BEGINNING``): code before the first block lands on stage 0, code after the last on
the last stage. The stage modules keep the original FQNs and hierarchy, so TP hooks, checkpoint
wrappers and FSDP2 apply to them by FQN. Chunk ``c`` of ``pp * virtual_stages`` runs on pipeline
rank ``c % pp``, or in a V (zbv, dualpipev) on rank c or 2 pp - 1 - c (autoplan/types/layout.py);
values a chunk needs from a chunk other than the one before it are carried through
(autoplan/execute/pipeline_carry.py). ``split_model`` records the model output's pytree spec, which
``pipeline()`` drops, so the loss rebuilds the model's output from the last stage's tensors. Experts
modules export as one opaque op each (autoplan/execute/expert_dispatch.py).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, SplitPoint, pipeline
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from autoplan.errors import PlanError
from autoplan.execute.dtype_extremes import read_extremes_by_dtype
from autoplan.execute.ep_lanes import Lanes
from autoplan.execute.expert_dispatch import ExpertsDispatch, opaque_experts, replace_experts_ops
from autoplan.execute.overlap_f_b import OverlappedDualPipeV
from autoplan.execute.pipeline_args import ModelOutput, values_bound
from autoplan.execute.pipeline_carry import carry_skip_values, own_outputs, stage_calls
from autoplan.execute.pipeline_regions import regions_kept
from autoplan.execute.split_backward import accumulate_weight_grads, joined_groups, weight_only_roots
from autoplan.execute.stage_outputs import owned_outputs, send_contiguous, send_contiguous_grads
from autoplan.execute.tied import retie, tied_names
from autoplan.execute.weight_pass import WeightPass, releases
from autoplan.trace.capture import drop_export_checks
from autoplan.trace.dataclass_outputs import register_dataclasses
from autoplan.types.layout import chunks_of_stage
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import step_microbatches
from autoplan.types.schedules import SPLIT_BACKWARD, v_shaped

SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "interleaved_zb": ScheduleInterleavedZeroBubble,  # B and W apart: stage_backward_input / _weight
    "zbv": ScheduleZBVZeroBubble,  # two chunks per rank in a V, B and W apart
    "dualpipev": ScheduleDualPipeV,  # the same V; its F&B pairs one after the other, or overlapped (overlap_f_b.py)
}


def stage_indices(*, plan: Plan, pp_rank: int) -> list[int]:
    """The chunk indices this pipeline rank runs: pp_rank, pp_rank + pp, ... (in a V: pp_rank, 2 pp - 1 - pp_rank)."""
    return chunks_of_stage(pp_rank, pp=plan.pp, virtual_stages=plan.virtual_stages, v_shape=v_shaped(plan.schedule))


def check_stages(*, model: nn.Module, plan: Plan) -> None:
    """Raise PlanError unless every stage names existing blocks (that they run in the order the
    stages list them is checked on the split itself, :func:`_check_split`: forward() may call
    modules in another order than it registers them)."""
    if len(plan.stages) != plan.pp * plan.virtual_stages:
        raise PlanError(
            f"plan pp={plan.pp} needs {plan.pp * plan.virtual_stages} entries in 'stages', "
            f"got {len(plan.stages)}; re-plan with stages."
        )
    names = {name for name, _ in model.named_modules()}
    for fqn in (fqn for stage in plan.stages for fqn in stage):
        if fqn not in names:
            raise PlanError(f"plan stages name block '{fqn}', which the model does not have; re-plan for this model.")
    if any(not stage for stage in plan.stages):
        raise PlanError("plan has an empty pipeline stage; every stage needs at least one block.")


def split_model(
    *, model: nn.Module, plan: Plan, microbatch_args: tuple, experts: dict[str, ExpertsDispatch] | None = None
) -> tuple[Any, ModelOutput | None]:
    """Export ``model`` on one micro-batch and cut it into ``len(plan.stages)`` stage modules.
    Return the ``Pipe`` and the spec that rebuilds the model's output from the last stage's
    tensors (None where the model returns one tensor), for ``build_schedule``. ``experts``: the
    model's experts modules by FQN, exported as one opaque op each and run by their dispatch."""
    check_stages(model=model, plan=plan)
    experts = experts or {}
    split_spec = {stage[0]: SplitPoint.BEGINNING for stage in plan.stages[1:]}
    try:
        with _output_spec(model) as spec, opaque_experts(model, experts), values_bound(model, microbatch_args) as args:
            with regions_kept():  # torch.no_grad() regions of forward() (execute/pipeline_regions.py)
                pipe = pipeline(model, mb_args=args, split_spec=split_spec)
    except Exception as exc:  # torch.export failed on this model
        said = str(exc).splitlines()[0] if str(exc) else ""
        why = NO_GRAD_REGION if "submod_" in said else ""
        raise PlanError(
            f"cannot split the model into pipeline stages with torch.export ({type(exc).__name__}: {said}){why}; "
            "plan pp=1 for this model."
        ) from exc
    if pipe.num_stages != len(plan.stages):
        raise PlanError(
            f"splitting at {list(split_spec)} gave {pipe.num_stages} stages, not {len(plan.stages)}; "
            "a split point is probably never called in forward()."
        )
    received = carry_skip_values(pipe.split_gm)  # values a later stage needs from an earlier one pass through
    for i in range(pipe.num_stages):
        drop_export_checks(pipe.get_stage_module(i))
        read_extremes_by_dtype(pipe.get_stage_module(i))  # finfo(x.dtype).min of the dtype autocast gives x
    for i in range(pipe.num_stages - 1):
        send_contiguous(pipe.get_stage_module(i))
        send_contiguous_grads(pipe.get_stage_module(i + 1))
    replaced = sum(replace_experts_ops(pipe.get_stage_module(i), experts) for i in range(pipe.num_stages))
    assert replaced >= len(experts), f"{len(experts)} experts modules exported as {replaced} autoplan::experts ops"
    out_spec = _flat_model_output(pipe.split_gm, out_spec=spec[0] if spec else None, received=received)
    ties = tied_names(model)
    for i in range(pipe.num_stages):
        retie(pipe.get_stage_module(i), ties)  # one Parameter per tied tensor within a stage
        # pipeline() leaves a tied weight's other owner on a stage that never calls it (GPT's lm_head
        # on the embedding's stage): a dead copy the cost model does not charge, so drop it
        pipe.get_stage_module(i).delete_all_unused_submodules()
    _check_split(pipe, plan)
    return pipe, out_spec


def _check_split(pipe: Any, plan: Plan) -> None:
    """Raise PlanError unless stage i of the split runs every block ``plan.stages[i]`` lists: the
    split cuts where forward() calls each stage's first block, so stages that list blocks out of
    the order forward() calls them put a block on another stage than the plan priced."""
    for index, stage in enumerate(plan.stages):
        held = {name for name, _ in pipe.get_stage_module(index).named_modules()}
        for fqn in stage:
            if fqn not in held:
                raise PlanError(
                    f"plan stage {index} lists block '{fqn}', which forward() does not run on that stage: stages "
                    "must list blocks in the order forward() calls them; re-plan for this model."
                )


#: what torch's split (2.13) fails on when the export wrapped a torch.no_grad() region of forward() (a spectral norm's
#: power iteration, a running mean updated in place) as a submodule of its own, which the split then looks for
NO_GRAD_REGION = (
    ": forward() runs code under torch.no_grad(), which torch.export keeps as a submodule of its own that torch's "
    "pipeline split cannot place"
)


@contextlib.contextmanager
def _output_spec(model: nn.Module) -> Iterator[list[pytree.TreeSpec]]:
    """Record the pytree spec of what ``model`` returns while ``pipeline()`` exports it."""
    specs: list[pytree.TreeSpec] = []

    def record(module: nn.Module, args: Any, output: Any) -> None:
        register_dataclasses(output)
        specs.append(pytree.tree_structure(output))

    handle = model.register_forward_hook(record)
    try:
        yield specs
    finally:
        handle.remove()


def _flat_model_output(
    split_gm: fx.GraphModule, *, out_spec: pytree.TreeSpec | None, received: list[fx.Node]
) -> ModelOutput | None:
    """Make the last stage return the model's output tensors in the model's flattening order, those
    it computes and those it receives (``received``: the split values its placeholders hold);
    return what rebuilds the model's output from them (None: a single tensor, as is)."""
    if out_spec is None or out_spec.is_leaf():
        return None  # the model returns one tensor (or export ran without calling forward): already right
    result = split_gm.graph.output_node().args[0]
    leaves = list(result) if isinstance(result, (tuple, list)) else [result]
    last = stage_calls(split_gm)[-1]
    module = getattr(split_gm, last.target)
    output = module.graph.output_node()
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    own = {**dict(zip(received, placeholders)), **own_outputs(output, last)}
    constants = tuple((i, leaf) for i, leaf in enumerate(leaves) if not isinstance(leaf, fx.Node))
    if len(leaves) != out_spec.num_leaves or any(leaf not in own for leaf in leaves if isinstance(leaf, fx.Node)):
        raise PlanError(
            "the model returns a value its last pipeline stage neither computes nor receives; "
            "return only values the model computes, or plan pp=1 for this model."
        )
    output.args = (tuple(own[leaf] for leaf in leaves if isinstance(leaf, fx.Node)),)
    module.recompile()
    return ModelOutput(out_spec, constants)


def build_schedule(
    *,
    stage_modules: dict[int, nn.Module],
    plan: Plan,
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable,
    out_spec: ModelOutput | None = None,
    lanes: Lanes | None = None,
) -> Any:
    """The plan's schedule over this rank's stages; the loss goes to the schedule, and sees the
    last stage's tensors rebuilt into what the model returns (``out_spec``, from ``split_model``).
    ``lanes``: the ep group's two lanes, under ``moe_a2a_overlap`` (DualPipeV's F&B pairs overlapped,
    autoplan/execute/overlap_f_b.py; types/moe_overlap.py admits it with no other schedule)."""
    if out_spec is not None:
        loss_fn = functools.partial(_loss_on_model_output, loss_fn=loss_fn, out_spec=out_spec)
    group = pp_mesh.get_group()
    num_stages = plan.pp * plan.virtual_stages
    if plan.schedule in SPLIT_BACKWARD:  # B and W apart (types/schedules.py)
        for module in stage_modules.values():
            module.register_forward_hook(owned_outputs)
    stages = [
        _ZeroFilledStage(module, index, num_stages, device, group=group)
        for index, module in sorted(stage_modules.items())
    ]
    cls = SCHEDULE_CLASSES[plan.schedule]
    # one schedule step's micro-batches (types/schedule_steps.py); torch divides the gradients by them after each
    # step's last backward, which over k > 1 steps would divide the earlier steps' again: there the loss is
    # divided by the step's m instead (Trainer.schedule_loss), and torch scales nothing
    kw = dict(n_microbatches=step_microbatches(plan), loss_fn=loss_fn, scale_grads=plan.schedule_steps == 1)
    if plan.moe_a2a_overlap:
        assert plan.schedule == "dualpipev" and lanes is not None, "types/moe_overlap.py check_executor_runs"
        return OverlappedDualPipeV(stages, **kw, lanes=lanes, recomputes=plan.recompute != "none")
    if issubclass(cls, PipelineScheduleMulti):
        return cls(stages, **kw)
    assert issubclass(cls, PipelineScheduleSingle) and len(stages) == 1
    return cls(stages[0], **kw)


class _ZeroFilledStage(PipelineStage):
    """A ``PipelineStage`` whose metadata inference runs on zeros, not on uninitialised memory.

    On its first step, torch's schedule runs every stage but the first on tensors it builds from
    the shapes and dtypes the stage before reports (``torch.empty_strided`` in torch 2.13), to learn
    what each stage sends. An integer input a later stage indexes with (T5's carried
    ``decoder_input_ids`` into its decoder embedding, position ids, a mask used as an index) then
    holds whatever the allocator left there, and the lookup fails ("index out of range in self")
    on some runs and not others. Zero is a valid index into every non-empty table and a finite
    value for every float, so the inference pass runs the stage on well-defined inputs; the shapes
    it learns are the same. Tensors the schedule passes in (the first stage's real inputs, the
    target) are views of the caller's data and are left as they are. ``_to_tensor`` is torch's
    private hook for this; a torch without it never calls the override, and behaves as before."""

    def _to_tensor(self, arg: Any) -> torch.Tensor:
        tensor = super()._to_tensor(arg)
        if not isinstance(arg, torch.Tensor):  # built from metadata: uninitialised
            with torch.no_grad():
                tensor.zero_()
        return tensor

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        """torch's shape inference (2.13) runs the stage's forward once more, on the first step: a forward that
        updates buffers (BatchNorm's running statistics, a spectral norm's vectors, a running mean) counted it, on
        zeros past the first stage. It runs on copies of the buffers (``.data``: the buffers the inference's graph
        saved are not written after it), which are then dropped; a torch without the hook never calls it."""
        with torch.no_grad():
            held = [(buffer, buffer.data) for buffer in self.submod.buffers()]
            for buffer, data in held:
                buffer.data = data.clone()
        try:
            return super()._forward_metadata_inference(*args, **kwargs)
        finally:
            for buffer, data in held:
                buffer.data = data

    def backward_maybe_with_nosync(self, backward_type: str, bwd_kwargs: dict, last_backward: bool = False) -> Any:
        """Torch's backward step, its split W completed with the weight-only outputs' gradients
        (autoplan/execute/split_backward.py): B records them before torch detaches the outputs and hands W
        torch's parameter groups as one, W adds them before torch's W frees the graph. Full backwards are
        left as they are."""
        if backward_type == "weight":
            groups = bwd_kwargs["param_groups"]
            accumulate_weight_grads(roots=getattr(groups, "weight_only", []), weights=self.submod.parameters())
            with WeightPass(getattr(groups, "releases", None)) as weight_pass:  # one re-run per block
                bwd_kwargs = {**bwd_kwargs, "param_groups": weight_pass.over(groups)}
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        if backward_type != "input":
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        roots = weight_only_roots(
            outputs=bwd_kwargs["stage_output"],
            output_grads=bwd_kwargs["output_grads"],
            inputs=bwd_kwargs["input_values"],
        )
        grads, groups = super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        groups, nodes = joined_groups(groups)
        return grads, _ParamGroups(groups, weight_only=roots, releases=releases(nodes))


class _ParamGroups(list):
    """Torch's parameter groups of one B (``stage_backward_input``), carrying the weight-only outputs to
    its W, and after which group W ends each recomputed block's re-run (execute/weight_pass.py): the stage
    passes the groups from B to W untouched."""

    def __init__(self, groups: list, *, weight_only: list, releases: list) -> None:
        super().__init__(groups)
        self.weight_only = weight_only
        self.releases = releases


def _loss_on_model_output(output: Any, target: Any, *, loss_fn: Callable, out_spec: ModelOutput) -> torch.Tensor:
    leaves = list(output) if isinstance(output, (tuple, list)) else [output]
    return loss_fn(out_spec.rebuild(leaves), target)
