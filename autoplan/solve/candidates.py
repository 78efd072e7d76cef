"""What a search works on and returns: its options, the groups it visits, one row per
configuration priced or pruned, and the result.

A pruned row stands for every configuration of its group (``count``); ``SearchResult.ranked``
orders the feasible rows by objective and, on a tie, by fewer tp, then cp, then pp ranks, so dp
is preferred when it is as fast (solve/search.py), then by the lower peak, then by the configuration's cells (a
total order).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from autoplan.cost import bubble_floor
from autoplan.solve import space
from autoplan.types.cost import Cost
from autoplan.types.local_sgd import is_local_sgd
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan
from autoplan.types.recompute import describe_counts
from autoplan.types.run import RunSpec


@dataclass
class SearchOptions:
    devices: int
    batch_size: int
    fixes: dict = field(default_factory=dict)
    objective: str = "time"
    solver: str = "highs"
    time_limit_s: float = 10.0
    progress: Callable[[int, int], None] | None = None
    keep: int = 1  # the search prices enough to rank the best `keep` plans exactly
    run: RunSpec | None = None  # the whole run: its length, prices, deadline and budget (cost/run/whole_run.py)
    allow_lossy: bool = False  # search (and allow pins of) lossy gradient sync: Plan.lossy
    allow_fp8: bool = False  # search fp8 too (a precision=fp8 pin needs no flag): solve/space.py
    runtime: str = "autoplan"  # the runtime every plan is priced for (types/runtime.py)
    jobs: int = 1  # processes the search runs on (solve/shares.py; 0: one per core, at most 4)


@dataclass
class Candidate:
    config: dict
    status: str  # 'evaluated' | 'pruned'
    lower_bound: float
    objective: float | None = None
    cost: Cost | None = None
    plan: Plan | None = None
    reason: str = ""
    count: int = 1  # configurations this row stands for (pruned groups)
    misses: str = ""  # the deadline or budget this plan's whole run misses (cost/run/whole_run.py:violation)

    @property
    def feasible(self) -> bool:
        return self.cost is not None and self.cost.feasible and not self.misses


@dataclass
class SearchResult:
    best: Plan | None
    best_cost: Cost | None
    candidates: list[Candidate]
    elapsed_s: float
    ilp_solves: int
    ilp_status: str
    ilp_gap: float
    refused: list[space.RefusedShape] = field(default_factory=list)  # shapes a rule refused (space.degree_options)
    processes: int = 1  # the processes the search ran on (solve/shares.py: 1 where it never split)

    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.candidates if c.feasible), key=rank_key)

    @property
    def evaluated(self) -> int:
        return sum(c.count for c in self.candidates if c.status == "evaluated")

    @property
    def pruned(self) -> int:
        return sum(c.count for c in self.candidates if c.status == "pruned")


@dataclass(frozen=True)
class Group:
    degrees: space.Degrees
    precision: str
    sp: bool
    mbs: int
    m: int
    b_min: float  # the least bubble floor of its schedules, in micro-batches (cost/pp/schedule.py:bubble_floor)
    routing: RoutingModel | None = None  # the graph's, for an MoE model: the plan records it
    cp_variant: str = "allgather"  # how the cp ranks exchange keys and values (solve/context_parallel.py)
    runtime: str = "autoplan"  # the runtime its plans are priced for (SearchOptions.runtime)
    compile: bool = False  # blocks compiled with torch.compile: only when pinned (--fix compile=on)
    schedule_steps: int = 1  # schedule steps of m / k: only when pinned (--fix schedule_steps=k)

    @staticmethod
    def least_bubble(schedules: list[tuple[str, int]], *, pp: int, share: float) -> float:
        """The least bubble floor of (schedule, virtual stages) pairs at ``pp``, in micro-batches (bubble_floor;
        ``share``: Bounds.zero_bubble_share)."""
        return min(bubble_floor(schedule=s, pp=pp, virtual_stages=v, share=share) for s, v in schedules)

    def pruned_config(self) -> dict:
        """The row of a group pruned whole: what varies inside it is '*'."""
        deg = self.degrees
        return dict(
            devices=deg.devices,
            dp=deg.dp,
            tp=deg.tp,
            pp=deg.pp,
            ep=deg.ep,
            expert_tp=deg.expert_tp,
            cp=deg.cp,
            cp_variant=self.cp_variant,
            mbs=self.mbs,
            num_microbatches=self.m,
            schedule="*",
            v="*",
            zero="*",
            recompute="*",
            sp=self.sp,
            tp_overlap="*",
            precision=self.precision,
            reduce="*",
            compression="*",
            param_gather="*",
            dp_replicate="*",
        )

    def plan(
        self,
        *,
        recompute: str,
        schedule: str,
        v: int,
        zero: int,
        tp_plan: dict,
        model: str,
        profile: str,
        stages: list | None = None,
        tp_overlap: bool = False,
        grads: space.GradSync = space.EXACT,
        steps: int = 0,
    ) -> Plan:
        """A Plan of this group, unchecked (Plan.unchecked): most are read only by a lower bound and pruned;
        the search checks the ones it prices (Plan.checked). Every choice comes from solve/space.py's rules,
        which offer only what a Plan accepts (tests/unit/solve/test_unchecked_plans.py). Made as a copy of
        :meth:`_template` with these fields, each plan with its own lists and dicts: the plan Plan.unchecked makes
        of the same keywords (tests/unit/solve/test_group_plans.py), several times cheaper. ``steps``: its schedule
        steps where not the group's (a schedule's entry k: solve/schedule_steps.py)."""
        plan = Plan.__new__(Plan)  # as Plan.unchecked makes it: no __init__, no checks
        fields = plan.__dict__
        fields.update(self._template.__dict__)  # every key in the template's order: the others set its values
        for name, kind, value in self._template_mutable:
            fields[name] = kind(value)
        fields["schedule"], fields["virtual_stages"], fields["recompute"] = schedule, v, recompute
        fields["tp_comm_overlap"] = tp_overlap
        fields.update(_dp_fields(zero, grads))
        fields["tp_plan"], fields["model"], fields["profile"], fields["stages"] = tp_plan, model, profile, stages or []
        if steps:
            fields["schedule_steps"] = steps
        return plan

    def plans(self, dp_choices: list, **kw) -> list[Plan]:
        """:meth:`plan` of each (zero, grads) of ``dp_choices`` with the other arguments ``kw``."""
        return [self.plan(zero=zero, grads=grads, **kw) for zero, grads in dp_choices]

    @functools.cached_property
    def _template(self) -> Plan:
        """A plan of this group through Plan.unchecked: its defaults, factories and the group's fields."""
        return Plan.unchecked(**self._plan_fields)

    @functools.cached_property
    def _template_mutable(self) -> tuple[tuple[str, type, Any], ...]:
        """(name, type, value) of the template's list and dict fields (Plan's default factories) that :meth:`plan`
        does not set: each plan gets its own copy, as from Plan.unchecked."""
        given = {"stages", "tp_plan"}
        fields = self._template.__dict__.items()
        return tuple((k, type(v), v) for k, v in fields if type(v) in (list, dict) and k not in given)

    @functools.cached_property
    def _plan_fields(self) -> dict:
        """The Plan fields every plan of this group shares (its degrees, micro-batches and precision)."""
        return dict(
            **asdict(self.degrees),  # devices, dp, tp, pp, ep, cp, expert_tp: the Plan's own names
            micro_batch_size=self.mbs,
            num_microbatches=self.m,
            sequence_parallel=self.sp,
            precision=self.precision,
            cp_variant=self.cp_variant,
            runtime=self.runtime,
            routing=self.routing,
            compile=self.compile,
            schedule_steps=self.schedule_steps,
        )


@functools.lru_cache(maxsize=1024)
def _dp_fields(zero: int, grads: space.GradSync) -> dict:
    """The Plan fields of one ZeRO and gradient-sync choice (solve/space.py dp_options); memoised, so read only."""
    return dict(
        zero_stage=zero,
        grad_reduce_dtype=grads.reduce_dtype,
        grad_compression=grads.compression,
        powersgd_rank=grads.rank,
        topk_ratio=grads.ratio,
        overlap_param_gather=grads.param_gather,
        dp_replicate=grads.replicate,
        offload=grads.offload,
        sync_every=grads.sync_every,
        outer_optimizer=grads.outer_optimizer,
    )


def pruned_row(config: dict, bound: float, *, top: float, keep: int, why: str = "", reason: str = "") -> Candidate:
    """The row of configurations a lower bound ruled out (``why``: which bound), or ``reason`` when another
    rule did."""
    tag = f" ({why})" if why else ""
    reason = reason or f"pruned{tag}: lower bound {bound:.4g} >= top-{keep} objective {top:.4g}"
    return Candidate(config=config, status="pruned", lower_bound=bound, reason=reason)


def memory_pruned_row(plan: Plan, bound: float, floor_bytes: float, usable_bytes: float, *, why: str = "") -> Candidate:
    """The row of a plan whose memory floor (``why``: of what) exceeds the usable bytes under any partition."""
    gib = 2**30
    reason = (
        f"pruned (memory): {why or 'weights, gradients and optimizer state alone'} need {floor_bytes / gib:.1f} GiB "
        f"per device under any partition, {usable_bytes / gib:.1f} GiB is usable"
    )
    return Candidate(config=config_of(plan), status="pruned", lower_bound=bound, reason=reason)


def rank_key(c: Candidate) -> tuple:
    """Objective first; on a tie, fewer model-parallel ranks (dp before tp before cp before pp), then the lower peak
    (more of the device spare), then the configuration's cells: a total order, so the best plan does not depend on
    the order the plans were priced in (solve/shares.py)."""
    return (*_first(c), _cells(c))


def better(a: Candidate, b: Candidate) -> bool:
    """``a`` ranks before ``b`` (:func:`rank_key`, its configuration's cells read only on a tie)."""
    first, second = _first(a), _first(b)
    return first < second if first != second else _cells(a) < _cells(b)


def _first(c: Candidate) -> tuple:
    return (c.objective, c.plan.tp, c.plan.cp, c.plan.pp, c.cost.peak_memory_bytes)


def _cells(c: Candidate) -> tuple:
    return tuple(sorted((name, str(value)) for name, value in c.config.items()))


def splits_nothing(tp_plan: dict[str, str]) -> bool:
    """A tp_plan that replicates every op: tp ranks would all repeat the same work."""
    return all(split == "replicate" for split in tp_plan.values())


def config_of(plan: Plan) -> dict:
    return dict(
        devices=plan.devices,
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        ep=plan.ep,
        expert_tp=plan.expert_tp,
        cp=plan.cp,
        cp_variant=plan.cp_variant,
        mbs=plan.micro_batch_size,
        num_microbatches=plan.num_microbatches,
        schedule=plan.schedule,
        v=plan.virtual_stages,
        zero=plan.zero_stage,
        recompute=describe_counts(plan.recompute, plan.recompute_blocks),  # "full:2/1" under a budget
        sp=plan.sequence_parallel,
        tp_overlap=plan.tp_comm_overlap,
        precision=plan.precision,
        reduce=plan.grad_reduce_dtype,
        compression=_compression(plan),
        param_gather=plan.overlap_param_gather,
        dp_replicate=plan.dp_replicate,
        **({"offload": plan.offload} if plan.offload != "none" else {}),  # plans.csv keeps its columns
        **({"offload_activations": True} if plan.offload_activations else {}),
        **({"moe_a2a_overlap": True} if plan.moe_a2a_overlap else {}),
        **({"sync_every": plan.sync_every, "outer_optimizer": plan.outer_optimizer} if is_local_sgd(plan) else {}),
        **({"schedule_steps": plan.schedule_steps} if plan.schedule_steps > 1 else {}),
    )


def _compression(plan: Plan) -> str:
    """plans.csv's compression column: none, powersgd:RANK or topk:RATIO."""
    if plan.grad_compression == "powersgd":
        return f"powersgd:{plan.powersgd_rank}"
    return f"topk:{plan.topk_ratio:g}" if plan.grad_compression == "topk" else "none"
