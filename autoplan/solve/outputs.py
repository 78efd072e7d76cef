"""The planner's files: plan.json, plans.csv, ops.csv, stages.csv (docs/plan-format.md; the rows of
ops.csv and stages.csv are types/tables.py's PricedOp and StageRow).

Every file is written atomically (autoplan/types/_check.py). ops.csv attributes the block's
TP comm terms (autoplan/cost/tp/splits.py) to ops: a unary term to its op, an edge term
to the consuming op, an any-of term to the first consumer that triggers it, the SP all-gather
of a stream input to its first consumer. Times are per
micro-batch on one device (forward + backward); bytes are per device. Compute and saved bytes
come from cost/compute/op_costs.py, which prices each op as autoplan/cost/blocks.py does, so a
block's rows sum to what CostModel charges it (tests/unit/solve/test_solve_agreement.py).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, itemgetter, ne, not_
from pathlib import Path

from autoplan.cost import CostModel, RunPricer, priced_ops, priced_profile
from autoplan.solve.candidates import SearchResult
from autoplan.solve.stage_costs import StageCosts
from autoplan.types._check import write_json_atomic, write_text_atomic
from autoplan.types.cost import Cost
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.run import RunSpec
from autoplan.types.schedules import plan_last_stage, plan_stage_of_chunk
from autoplan.types.tables import Column, PricedOp, StageRow, csv_text, joined_text, table_text

CONFIG_COLUMNS = (
    "devices",
    "dp",
    "ep",
    "tp",
    "pp",
    "cp",
    "cp_variant",
    "mbs",
    "num_microbatches",
    "schedule",
    "v",
    "zero",
    "recompute",
    "sp",
    "tp_overlap",
    "precision",
    "reduce",
    "compression",
    "param_gather",
    "dp_replicate",
)


def write_outputs(
    out_dir: str | Path, *, result: SearchResult, graph: Graph, profile: Profile, run: RunSpec | None = None
) -> dict[str, Path]:
    """Write the four files (plan.json only when a plan was found); return their paths. With the
    whole run's length (``run``), plans.csv has its time and cost for every priced plan."""
    out = Path(out_dir)
    pricer = None
    plans = [c.plan for c in result.candidates if c.plan is not None]
    if run is not None and run.has_length and plans:
        pricer = RunPricer(
            run,
            profile=priced_profile(profile, run),
            params=graph.param_count,
            batch_size=plans[0].global_batch_size,
            seq_len=graph.seq_len,
        )
    paths = {"plans.csv": write_text_atomic(out / "plans.csv", plans_csv(result, pricer=pricer))}
    if result.best is not None:
        paths["plan.json"] = result.best.save(out / "plan.json")
        paths["ops.csv"] = write_text_atomic(out / "ops.csv", ops_csv(graph, profile, result.best))
        paths["stages.csv"] = write_text_atomic(out / "stages.csv", stages_csv(graph, profile, result.best))
    # the inputs, so `autoplan explain DIR` and `autoplan report DIR` can re-price plans (autoplan/report/)
    paths["graph.json"] = graph.save(out / "graph.json")
    paths["profile.json"] = write_json_atomic(out / "profile.json", profile.to_dict())
    return paths


RUN_COLUMNS = ("wall_h", "device_hours", "cost_usd", "spot_wall_h", "spot_cost_usd")


def plans_csv(result: SearchResult, *, pricer: RunPricer | None = None) -> str:
    """Every candidate, the ranked ones first, the others by lower bound; with ``pricer``, also its
    whole run (RUN_COLUMNS; cost/run/whole_run.py). A row is parts, each written on its own (types/tables.py,
    joined_text): its price (one shared part for the rows that have none) and its configuration, rows of
    cells; its lower bound, optional columns, count and reason, each a Column. The parts are read off the
    candidates column by column (``map`` of attribute and item getters: one C call a cell where a loop over
    74K candidates of GPT-1T spent 0.2 s), in the search's order; the rows are written in the file's
    (_file_order)."""
    run_columns = [c for c in RUN_COLUMNS if pricer is not None and (pricer.spec.spot or not c.startswith("spot"))]
    candidates = result.candidates
    configs = list(map(attrgetter("config"), candidates))
    optional = _shown_at_non_default(configs)
    head = ["rank", "status", "feasible", "objective", "step_time_s", *Cost.TIME_FIELDS, "peak_memory_bytes"]
    price_columns = [*head, "samples_per_s", "mfu", *run_columns]
    header = [*price_columns, "lower_bound", *CONFIG_COLUMNS, *optional, "configurations", "reason"]
    ranks = {id(c): i + 1 for i, c in enumerate(result.ranked())}
    bounds = Column(map(attrgetter("lower_bound"), candidates))
    parts = [
        _price_rows(candidates, ranks, len(price_columns), run_columns, pricer),
        bounds,
        _config_rows(configs, CONFIG_COLUMNS),
        *(Column(map(dict.get, configs, repeat(name), repeat(""))) for name in optional),
        Column(map(attrgetter("count"), candidates)),
        Column(map(attrgetter("reason"), candidates)),
    ]
    return joined_text(header, parts, order=_file_order(candidates, ranks, bounds))


def _price_rows(candidates: list, ranks: dict[int, int], width: int, run_columns: list[str], pricer) -> list[tuple]:
    """Each candidate's cells from rank to its run columns (``width`` of them): its price, its objective
    alone, or one tuple shared by the rows of its status that have neither."""
    unpriced = {}  # status -> the shared cells of its rows that have neither cost nor objective
    rows = []
    for c in candidates:
        if c.cost is not None:
            rows.append(_priced_cells(c, ranks.get(id(c), ""), run_columns, pricer))
        elif c.objective is None:
            rows.append(unpriced.get(c.status) or unpriced.setdefault(c.status, ("", c.status, *[""] * (width - 2))))
        else:
            rows.append(("", c.status, "", c.objective, *[""] * (width - 4)))
    return rows


def _file_order(candidates: list, ranks: dict[int, int], bounds: list[float]) -> list[int]:
    """Indexes of ``candidates`` in plans.csv's order: the ranked ones by rank, then the others by lower
    bound (``bounds``: theirs; in the search's order where they tie). Which are ranked: one C pass (``map``)."""
    ranked_mask = list(map(ranks.__contains__, map(id, candidates)))
    ranked = sorted(compress(range(len(candidates)), ranked_mask), key=lambda i: ranks[id(candidates[i])])
    others = list(compress(range(len(candidates)), map(not_, ranked_mask)))
    others.sort(key=bounds.__getitem__)
    return ranked + others


def _config_rows(configs: list[dict], names: tuple[str, ...]) -> list[tuple]:
    """Each configuration's cells under ``names`` ('' where it has none): one C call a row (``map`` of an
    ``itemgetter``) when every configuration holds every name, as the search's do for CONFIG_COLUMNS, else
    ``dict.get`` with '' name by name."""
    blanks = ("",) * len(names)
    if len(names) > 1:
        try:
            return list(map(itemgetter(*names), configs))
        except KeyError:
            pass
    return [tuple(map(config.get, names, blanks)) for config in configs]


def _priced_cells(c, rank: int | str, run_columns: list[str], pricer: RunPricer | None) -> tuple:
    """A priced row's cells from rank to its run columns (plans_csv's header)."""
    cost = c.cost
    if c.objective is None:  # its memory alone was priced: it does not fit (solve/memory_first.py)
        blank = [""] * (2 + len(Cost.TIME_FIELDS))  # objective, step time and its terms
        return (rank, c.status, c.feasible, *blank, cost.peak_memory_bytes, "", "", *[""] * len(run_columns))
    times = [getattr(cost, name) for name in Cost.TIME_FIELDS]
    estimate = pricer.estimate(step_time_s=cost.step_time_s, devices=c.plan.devices) if pricer else None
    run = [getattr(estimate, name) if estimate else "" for name in run_columns]
    head = [rank, c.status, c.feasible, c.objective, cost.step_time_s, *times]
    return (*head, cost.peak_memory_bytes, cost.samples_per_s, cost.mfu, *run)


#: columns written only when some candidate leaves their default (as plan.json omits fields at theirs),
#: so searches without them write the plans.csv they always did
OPTIONAL_COLUMNS = (("expert_tp", 1), ("schedule_steps", 1))


def _shown_at_non_default(configs: list[dict]) -> tuple[str, ...]:
    """The :data:`OPTIONAL_COLUMNS` some of ``configs`` sets to another value than the default (``value !=
    default``, as ``map`` of ``operator.ne``)."""
    found = [
        name
        for name, default in OPTIONAL_COLUMNS
        if any(map(ne, map(dict.get, configs, repeat(name), repeat(default)), repeat(default)))
    ]
    return tuple(found)


SWEEP_COLUMNS = (
    "profile",
    "instance",
    "devices",
    "status",
    "pareto",
    "recommended",
    "plan",
    "step_time_s",
    "steps",
    "expected_wall_h",
    "device_hours",
    "cost_usd",
    "spot_wall_h",
    "spot_cost_usd",
    "goodput",
    "spot_goodput",
    "reason",
)


def sweep_csv(result) -> str:
    """One row per (profile, devices) point of a sweep (solve/cluster.py), planned or not, and why."""
    rows = []
    for row in result.rows:
        e = row.estimate
        rows.append(
            [
                row.profile,
                row.rental(),
                row.devices,
                row.status,
                row.pareto,
                row is result.recommended,
                row.plan.describe() if row.plan else "",
                *(
                    getattr(e, name) if e is not None and getattr(e, name) is not None else ""
                    for name in SWEEP_COLUMNS[7:16]
                ),
                row.reason,
            ]
        )
    return csv_text(SWEEP_COLUMNS, rows)


def ops_csv(graph: Graph, profile: Profile, plan: Plan) -> str:
    """One row per op of ``plan`` (cost/op_table.py)."""
    return table_text(priced_ops(graph, profile, plan), PricedOp)


def stages_csv(graph: Graph, profile: Profile, plan: Plan) -> str:
    """One row per pipeline stage of ``plan``, priced on the graph its runtime runs (CostModel.for_runtime)."""
    model = CostModel(graph, profile).for_runtime(plan.runtime)
    costs = StageCosts(model.graph, profile, model)
    problem = costs.problem(plan, memory_limit=False)
    position = {layer: i for i, layer in enumerate(graph.layers)}
    owned: list[list[str]] = [[] for _ in range(plan.pp)]
    for index, chunk in enumerate(plan.stages):
        owned[plan_stage_of_chunk(plan, index)].extend(chunk)
    chunks = [(c, position[chunk[0]], position[chunk[-1]] + 1) for c, chunk in enumerate(plan.stages) if chunk]
    ctx = costs.context(plan)
    inputs = [costs.summary(layer, "", plan.tp_plan, ctx).input_bytes for layer in graph.layers]
    priced, _tp_plan, _ctx = costs.cost_model.priced_stages(plan)  # each stage's peak, as plan.json prices it
    peaks = [m.peak_bytes for m in costs.cost_model.stage_memory(plan, priced)]
    rows = []
    for k, layers in enumerate(owned):
        mine = [(c, i, j) for c, i, j in chunks if plan_stage_of_chunk(plan, c) == k]
        recv = max((inputs[i] for c, i, _ in mine if problem.sent(c)), default=0.0)
        send = max((inputs[j] for c, _, j in mine if problem.sent(c + 1)), default=0.0)
        idx = [position[layer] for layer in layers]
        time_s = sum(problem.layer_time_s[i] for i in idx) + problem.extra_time_s[k]
        rows.append(
            StageRow(
                stage=k,
                blocks=len(layers),
                first_block=layers[0] if layers else "",
                last_block=layers[-1] if layers else "",
                micro_batch_time_s=time_s,
                memory_bytes=int(peaks[k]),
                send_bytes=int(send),
                recv_bytes=int(recv),
                send_recv_s=sum(problem.chunk_cuts_s(c, i, j) for c, i, j in mine) / 2,
                forward_s=_forward_s(costs, plan, k, layers),
            )
        )
    return table_text(rows, StageRow)


def _forward_s(costs: StageCosts, plan: Plan, stage: int, layers: list[str]) -> float:
    """The forward part (ops + TP collectives) of one micro-batch on ``stage``; the rest of
    micro_batch_time_s is backward (and recomputation). Used by the report's timeline."""
    ctx = costs.context(plan)
    total = sum(b.fwd_s + b.tp_fwd_s for b in (costs.summary(layer, "", plan.tp_plan, ctx) for layer in layers))
    if stage == 0:
        total += costs.summary(None, "pre", plan.tp_plan, ctx).fwd_s
    if stage == plan_last_stage(plan):
        post = costs.summary(None, "post", plan.tp_plan, ctx)
        total += post.fwd_s + post.tp_fwd_s
    return total
