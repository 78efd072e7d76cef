"""The outer search: every legal configuration, priced by the cost model, pruned by bounds
(docs/ilp.md, section 4).

A *group* fixes (devices, dp, cp, tp, pp, ep, expert_tp, cp variant, precision, sequence parallelism,
micro-batch size: solve/space.py, solve/context_parallel.py, solve/expert_layout.py); its members vary
recomputation, schedule (with virtual stages), ZeRO stage and gradient sync (solve/space.py). Groups are
visited in increasing bound (best-first branch and bound) and pruned once the bound reaches the
``keep``-th best objective (``plan --exact-top-k``: the console's top k exact; else the best alone):

    LB  = (m + b_min) * C_min / pp  +  optimizer_min                                      (1)
    LB2 = (m + b(schedule, v)) * T_slowest + pp_comm + optimizer(zero)                    (2)

``C_min``: one micro-batch's forward + backward, every op divided tp ways, no communication (experts as
CostModel prices them, cost/bounds.py; under cp 1/cp of the tokens plus each attention's K,V floor); ``b``:
``bubble_floor`` (zero-bubble: times a floor on (T - 2W - R) / T; V: f / T), ``b_min`` the group's least, a member's (2)
no less than (1) at its own b; (2) uses the real stages, smallest send/recv, Adam, ZeRO-1/2 gather and the sync
nothing hides: never above the priced step. Inside a group the tp_plan comes from the intra-op ILP
(solve/tp_plan.py, again with its memory row when nothing fits), the stages from solve/pipeline.py; survivors are
priced by ``CostModel.estimate``. Objective ``time``: step time; ``cost``: dollars per sample or per run
(cost/run/whole_run.py), both rising with the step time at fixed devices, so the bounds hold. A group whose ILP
splits no op at tp > 1 is pruned unless tp is pinned. Groups and members are taken best first across the whole space
in one pass, each group expanded once, until the least key left is beaten (solve/best_first.py); (2) is
solve/member_bounds.py's; a plan's memory is priced before its time (solve/memory_first.py).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import replace

from autoplan.cost import (
    Bounds,
    CostModel,
    DtypePolicy,
    MemoryBudget,
    ParamStepPrice,
    dollars_per_sample,
    policy_for,
    run_pricer,
    usable_bytes,
)
from autoplan.errors import PlanError
from autoplan.solve import (
    activation_offload,
    best_first,
    candidates,
    empty_space,
    expert_layout,
    memory_first,
    moe_overlap,
    recompute_budget,
    schedule_steps,
    shares,
    space,
    tp_runnable,
)
from autoplan.solve.candidates import Candidate, Group, SearchOptions, SearchResult, better, config_of, splits_nothing
from autoplan.solve.context_parallel import cp_sequence
from autoplan.solve.groups import bounded_groups
from autoplan.solve.partitions import Partitions
from autoplan.solve.pin_checks import check_option_pins
from autoplan.solve.sparse_grads import keep_dp_choices, sparse_tables
from autoplan.solve.stage_costs import StageCosts
from autoplan.solve.stage_floor import StageFloors
from autoplan.solve.tp_plan import TPChoice, TPPlanner
from autoplan.types.context_parallel import masked_attention
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.runtime import runtime_named

OBJECTIVES = space.OBJECTIVES
#: what a held plan's floor counts beside its model states, as its plans.csv row says
IN_FLIGHT, SENT = "model states with the activations in flight", "model states with the tensors sent between stages"


class Search:
    def __init__(self, graph: Graph, profile: Profile, options: SearchOptions):
        if options.objective not in OBJECTIVES:
            raise PlanError(f"--objective {options.objective} is unknown; expected one of {', '.join(OBJECTIVES)}.")
        if options.objective == "cost" and profile.price_per_device_hour is None:
            raise PlanError(
                f"--objective cost needs a price, but profile '{profile.name}' has no pricing section; pass "
                "--price-per-device-hour X, add pricing (docs/profile-format.md) or use --objective time."
            )
        self.pricer = run_pricer(
            options.run, graph=graph, profile=profile, batch=options.batch_size, objective=options.objective
        )
        self.graph, self.profile, self.options, self.fixes = graph, profile, options, options.fixes
        self.moe_limits = expert_layout.limits(graph, self.fixes, runtime=options.runtime)  # or its pin, refused
        check_option_pins(graph, profile, self.fixes, options)  # refused in one sentence (solve/pin_checks.py)
        self.cp_seq_len = cp_sequence(graph, profile, self.fixes)  # 0: cp = 1 only (solve/context_parallel.py)
        self.cp_masked = masked_attention(graph)  # cp then runs the variants that apply masks
        self.max_tp = tp_runnable.max_tp(graph, self.fixes)  # raises for a tp pin the model's ops cannot run
        self.sparse_tables = sparse_tables(graph)  # they narrow the space (solve/sparse_grads.py)
        self.routing = graph.moe_layers[0].routing if graph.moe_layers else None
        self.expert_params = sum(m.expert_params for m in graph.moe_layers)
        self.cost_model = CostModel(graph, profile).for_runtime(options.runtime)  # every price reads its graph
        graph = self.cost_model.graph
        self.runtime_fuses = runtime_named(options.runtime).fused_elementwise  # every plan's element-wise ops
        planner = dict(solver=options.solver, time_limit_s=options.time_limit_s, node_times=self.cost_model.node_times)
        self.tp_planner = TPPlanner(graph, profile, **planner)
        self.stage_costs = StageCosts(graph, profile, self.cost_model)
        self.bounds = Bounds(graph, profile, self.stage_costs)
        self.partitions = Partitions(graph, self.stage_costs, solver=options.solver)
        self.stage_floors = StageFloors(self)  # held plans' floors on their own stages (solve/stage_floor.py)
        self._usable_bytes = usable_bytes(profile.device.memory_bytes)  # what CostModel calls feasible
        self.best: Candidate | None = None
        self._top: list[float] = []  # max-heap (negated) of the best `keep` feasible objectives
        self.candidates: list[Candidate] = []
        self.budgets = recompute_budget.BudgetBounds(self.fixes, options.runtime)  # which plans get a recompute budget
        self.refused: list[space.RefusedShape] = []  # the shapes the rules refused, for solve/notes.py
        self.memory_first = True  # price a plan's memory before its time (solve/memory_first.py)
        self.best_first = True  # groups and members best first (solve/best_first.py); else groups by bound (1)
        self._dp_memo, self._stage_memo = {}, {}  # _dp_choices by degrees, _stage_options by (tp, pp, sp, m)
        self.steps_searched = schedule_steps.searched(self.fixes, options.runtime)  # k > 1 unpinned (its module)
        self.steps_settle = options.keep == 1  # a plan that fits settles its larger k; not for an exact top k (a
        # runner-up may be the best plan at a larger k), nor in the tests that price every k
        self.steps_fitted: set = set()  # plans of no recompute that settled their k (schedule_steps.settles)
        self.steps_next: list[Plan] = []  # plans _evaluate priced that leave their next k to search

    # ---- objective ---------------------------------------------------------------------
    def objective(self, step_time_s: float, devices: int) -> float:
        if self.options.objective == "time":
            return step_time_s
        if self.pricer is not None:
            return self.pricer.dollars(step_time_s=step_time_s, devices=devices)
        return dollars_per_sample(
            self.profile, devices=devices, step_time_s=step_time_s, batch_size=self.options.batch_size
        )

    def _beaten(self, bound: float) -> bool:
        """Nothing with this bound can enter the top ``keep`` plans (so the top-k table is exact)."""
        return len(self._top) >= self.options.keep and bound >= -self._top[0]

    # ---- groups and their bounds -------------------------------------------------------
    def groups(self) -> list[tuple[float, Group]]:
        """Every legal group with its bound (1), best first (solve/groups.py)."""
        return bounded_groups(self)

    def lower_bound(self, g: Group) -> float:
        """Bound (1) of the module docstring, in objective units."""
        return self.objective(self.step_lower_bound_s(g), g.degrees.devices)

    def step_lower_bound_s(self, g: Group) -> float:
        """Bound (1) of the module docstring, in seconds."""
        per_microbatch_s, adam_s = self.bound_parts_s(g)
        return (g.m + g.b_min) * per_microbatch_s + adam_s

    def bound_parts_s(self, g: Group) -> tuple[float, float]:
        """Bound (1)'s C_min / pp and optimizer_min, in seconds."""
        deg = g.degrees
        experts = self.cost_model.placement(routing=g.routing, **expert_layout.placement_degrees(deg))
        cp = dict(cp=deg.cp, cp_variant=g.cp_variant, dp=deg.dp, pp=deg.pp) if deg.cp > 1 else {}
        overlap = space.tp_overlap_options(profile=self.profile, tp=deg.tp, sequence_parallel=g.sp, fixes=self.fixes)
        cp["fused"] = g.compile or True in overlap or self.runtime_fuses  # async TP compiles (compute/fusion.py)
        cp["a2a_share"] = moe_overlap.a2a_floor_share(self.fixes, self.options.runtime, deg)  # solve/moe_overlap.py
        c_min_s = self.bounds.compute_min_s(tp=deg.tp, precision=g.precision, mbs=g.mbs, experts=experts, **cp)
        zero_dp = deg.dp_cp if any(z >= 1 for z in space.zero_options(dp=deg.dp_cp, fixes=self.fixes)) else 1
        held = expert_layout.held_floor(params=self.graph.param_count, experts=self.expert_params, deg=deg, zdp=zero_dp)
        return c_min_s / deg.pp, self.bounds.adam_s(held)

    # ---- the search --------------------------------------------------------------------
    def run(self) -> SearchResult:
        start = time.perf_counter()
        groups = self.groups()
        if not groups:
            raise PlanError(empty_space.no_configuration(self.options, len(self.graph.layers)))
        jobs = shares.usable_jobs(self.options.jobs)
        split = shares.Shares(self, groups, jobs) if jobs > 1 and len(groups) > 1 else None  # solve/shares.py
        try:
            best_first.Pass(self, groups, best_first=self.best_first, shares=split).run()  # every row written
            statuses = self.tp_planner.statuses() + (split.merge() if split else [])
        finally:
            if split:
                split.stop()
        if self.options.progress:
            self.options.progress(len(groups), len(groups))
        status = "time_limit" if any(s.status == "time_limit" for s in statuses) else "optimal"
        gap = max((s.gap or 0.0 for s in statuses), default=0.0)
        best = self.best
        return SearchResult(
            best=best.plan if best else None,
            best_cost=best.cost if best else None,
            candidates=self.candidates,
            elapsed_s=time.perf_counter() - start,
            ilp_solves=self.tp_planner.solves,
            ilp_status=status,
            ilp_gap=gap,
            refused=self.refused,
            processes=1 + len(split.children) if split else 1,
        )

    def _degenerate(self, g: Group, choice: TPChoice) -> bool:
        """Whether ``choice`` splits no op at tp > 1 (unless tp is pinned): the group is pruned."""
        return g.degrees.tp > 1 and "tp" not in self.fixes and splits_nothing(choice.tp_plan)

    def _choose(self, g: Group, budget: MemoryBudget | None = None, *, zero: int = 0) -> TPChoice:
        """The group's tp_plan for its members of ZeRO stage ``zero``: priced in the run dtypes they run (the
        dtype policy reads the stage: compute/dtypes.py), each split also charged what the step charges its
        parameters at that stage (:meth:`step_price`), within ``budget`` when given."""
        deg, ilp = g.degrees, dict(sequence_parallel=g.sp, precision=g.precision, micro_batch_size=g.mbs)
        ilp.update(fused=g.compile or self.runtime_fuses)  # element-wise ops priced as fused regions
        if deg.cp > 1:  # the block is priced at a rank's 1/cp of the tokens (split_context)
            ilp.update(cp=deg.cp, cp_variant=g.cp_variant)
        ilp.update(dtypes=self.dtype_policy(g, zero), step=self.step_price(g, zero) if deg.tp > 1 else None)
        return self.tp_planner.choose(dp=deg.dp, tp=deg.tp, pp=deg.pp, budget=budget, **ilp)

    def dtype_policy(self, g: Group, zero: int) -> DtypePolicy | None:
        """The dtype policy of the group's plans at ZeRO stage ``zero`` (compute/dtypes.py dtype_policy)."""
        deg, backend = g.degrees, self.profile.backend
        return policy_for(precision=g.precision, runtime=g.runtime, dp_cp=deg.dp_cp, zero_stage=zero, backend=backend)

    def step_price(self, g: Group, zero: int) -> ParamStepPrice:
        """What the step charges a rank's parameters once a step (cost/dp/param_step.py) in the group's plans of
        ZeRO stage ``zero``, with the first gradient sync the search offers that stage (the exact one)."""
        grads = next(grads for z, grads in self._dp_choices(g.degrees) if z == zero)
        _, recompute, (schedule, v, _) = self._stage_options(g)[0]  # the messages read none of these
        names = dict(model=self.graph.model_name, profile=self.profile.name)
        plan = g.plan(recompute=recompute, schedule=schedule, v=v, zero=zero, grads=grads, tp_plan={}, **names)
        return ParamStepPrice(plan, self.profile, self.cost_model.dp_terms)

    def _over_floor(self, plan: Plan, sub: float, too_big: list, held: list, *, states_bytes: float) -> bool:
        """Whether ``plan``'s memory floor sets it aside: its states alone (``too_big``; ``states_bytes``: its
        Bounds.states_floor_bytes), or with its activations or its sends. Each joins its list as (floor, plan,
        bound (2), of what the floor is)."""
        if (floor := states_bytes) > self._usable_bytes:
            too_big.append((floor, plan, sub, ""))
            return True
        return self._held_back(plan, sub, held)

    def _held_back(self, plan: Plan, sub: float, held: list) -> bool:
        """Whether ``plan``'s :meth:`held_floor_bytes` exceeds the device: then it joins ``held`` and, recomputing
        nothing, is recorded short for the budgets (:meth:`held_short`)."""
        floor, why = self.held_floor_bytes(plan)
        if floor <= self._usable_bytes:
            return False
        self.held_short(plan)
        held.append((floor, plan, sub, why))
        return True

    def held_short(self, plan: Plan) -> None:
        """Record ``plan``, whose held floor exceeds the device, short for the recompute budgets
        (recompute_budget.py) as pricing it would (:meth:`_evaluate`: a plan that does not fit), wherever the search
        finds it so (at its entry schedule step or a larger one, solve/schedule_steps.py): whether a budget is
        fitted must not depend on how the plan was found not to fit. Its all-to-all twin, priced beside it where
        the plan is priced, too: the twin peaks no lower (it runs the same order, Megatron-Core's with one forward
        more ahead: cost/pp/schedule.py). Only a plan of no recompute is recorded."""
        if plan.recompute != "none" or not self.budgets.searched:
            return
        if (pinned := moe_overlap.with_pin(plan, self.fixes)) is None:
            return
        self.budgets.fitted(self.cost_model, pinned, feasible=False)
        if (twin := moe_overlap.overlapped_twin(pinned, self.fixes)) is not None:
            self.budgets.fitted(self.cost_model, twin, feasible=False)

    def held_floor_bytes(self, plan: Plan) -> tuple[float, str]:
        """``plan``'s memory floor with its activations in flight (Bounds.memory_floor_bytes) or, where larger, with
        the tensors torch's runtime holds sent (Bounds.sends; not counted where its activations may go to the host),
        and of what it is (IN_FLIGHT or SENT)."""
        offload = activation_offload.may_offload(plan, self.profile, self.fixes)
        floor = self.bounds.memory_floor_bytes(plan, offload=offload)
        sends = 0.0 if offload else self.bounds.sends.floor_bytes(plan)
        return (floor, IN_FLIGHT) if floor >= sends else (sends, SENT)

    def _dp_choices(self, deg: space.Degrees) -> list:
        if deg not in self._dp_memo:
            choices = space.dp_options(self.profile, deg=deg, fixes=self.fixes, options=self.options)
            self._dp_memo[deg] = keep_dp_choices(choices, self.sparse_tables)
        return self._dp_memo[deg]

    def _append_pruned(self, plan: Plan, sub: float) -> None:
        self.candidates.append(candidates.pruned_row(config_of(plan), sub, top=-self._top[0], keep=self.options.keep))

    def _stage_options(self, g: Group) -> list[tuple[bool, str, tuple[str, int, int]]]:
        """(tp_comm_overlap, recompute, (schedule, v, entry k)) choices of a group: what sets its stage times; a
        schedule that runs m / k but not m enters at that k (schedule_steps.schedule_entries)."""
        deg, layers = g.degrees, len(self.graph.layers)
        if (key := (deg.tp, deg.pp, g.sp, g.m, g.schedule_steps)) not in self._stage_memo:
            entries = schedule_steps.schedule_entries(
                pp=deg.pp, layers=layers, m=g.m, k=g.schedule_steps, fixes=self.fixes, runtime=self.options.runtime
            )
            self._stage_memo[key] = [
                (overlap, recompute, entry)
                for overlap in space.tp_overlap_options(
                    profile=self.profile, tp=deg.tp, sequence_parallel=g.sp, fixes=self.fixes
                )
                for recompute in space.recompute_options(fixes=self.fixes, layers=layers)
                for entry in entries
            ]
        return self._stage_memo[key]

    def _evaluate(self, plan: Plan, bound: float, *, ilp_status: str, chain: bool = False) -> None:
        """Price ``plan`` and its retries; ``chain``: where it does not settle its larger schedule steps
        (solve/schedule_steps.py), it joins ``steps_next`` (its all-to-all twin only where it does)."""
        plan = moe_overlap.with_pin(recompute_budget.with_pin(plan.checked(), self.fixes), self.fixes)
        if (plan := activation_offload.with_pin(plan, self.fixes)) is None:
            return  # a pinned recompute budget, all-to-all overlap or activation offload this plan cannot hold
        given = plan
        cost, plan, timed = memory_first.price(self, plan)  # its time only where it fits (solve/memory_first.py)
        if chain := chain and self.steps_searched and plan.pp > 1:
            fitted = cost.feasible and plan.stages == given.stages  # not repartitioned within memory
            if not (chain := schedule_steps.settles(self, given, fitted)):
                self.steps_next.append(given)
        candidate = memory_first.row(self, plan, bound, cost, timed=timed, ilp_status=ilp_status)
        if cost.feasible and self.pricer is not None and self.pricer.spec.constrained:
            candidate.misses = self.pricer.violation(step_time_s=cost.step_time_s, devices=plan.devices)
            candidate.reason = candidate.misses or candidate.reason
        self.candidates.append(candidate)
        if candidate.feasible:
            heapq.heappush(self._top, -candidate.objective)
            if len(self._top) > self.options.keep:
                heapq.heappop(self._top)
            if self.best is None or better(candidate, self.best):
                self.best = candidate
        if fitted := self.budgets.fitted(self.cost_model, plan, candidate.feasible):  # fewer blocks recomputed
            self._evaluate(fitted, bound, ilp_status=ilp_status)
        if retry := activation_offload.offloaded_retry(plan, cost=cost, profile=self.profile, fixes=self.fixes):
            self._evaluate(retry, bound, ilp_status=ilp_status)  # it did not fit: its activations offloaded
        if twin := moe_overlap.overlapped_twin(plan, self.fixes):
            self._evaluate(twin, bound, ilp_status=ilp_status, chain=chain)  # all-to-all overlapped (moe_overlap.py)

    def _stages(self, plan: Plan) -> list[list[str]]:
        return self.partitions.stages(plan)

    def _prune_group(self, g: Group, bound: float, why: str, reason: str = "", count: int = 0, **known) -> None:
        """One pruned row for the group, or for its ``count`` members with the ``known`` values."""
        dp_choices = self._dp_choices(g.degrees)
        count = count or len(self._stage_options(g)) * len(dp_choices)
        top, keep = (-self._top[0] if self._top else 0.0), self.options.keep
        row = candidates.pruned_row({**g.pruned_config(), **known}, bound, top=top, keep=keep, why=why, reason=reason)
        self.candidates.append(replace(row, count=count))


def search(graph: Graph, profile: Profile, options: SearchOptions) -> SearchResult:
    """Search every configuration (module docstring) and return the best plan and all candidates."""
    space.check_cluster(profile, options.devices)
    if not isinstance(options.batch_size, int) or options.batch_size < 1:
        raise PlanError(f"--batch {options.batch_size!r} is not a positive integer.")
    return Search(graph, profile, options).run()
