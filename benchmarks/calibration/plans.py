"""The plans the calibration benchmark runs: the planner's own search space for 2 processes.

Each configuration is pinned with ``--fix`` semantics and handed to the planner
(``autoplan.solve.api.plan_graph``), which fills in what a pin leaves open (the tp_plan from its
ILP, the pipeline stages from its partition) and prices it, exactly as `autoplan plan --fix` does.
Configurations come from autoplan/solve/space.py (degrees, micro-batch sizes, schedules with
virtual stages, ZeRO stages, recomputation, sequence parallelism, precision).

Spaces:
- ``full``: every configuration of that space;
- ``default``: every degree, schedule, ZeRO stage and SP choice, with recomputation "none",
  plus each other recomputation choice on the first plan of every degree; pipelines at 2, 4 and 8
  micro-batches, dp and tp at one (the full space multiplies every axis by every other, ~190
  plans per model, and each run costs ~20 s of process start-up here);
- ``quick``: a handful (one per degree, one pipeline schedule), for development.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import PlanError
from autoplan.solve import sequence_parallel, space
from autoplan.solve.api import plan_graph
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

PIPELINE_MICROBATCHES = (2, 4, 8)


@dataclass(frozen=True)
class Config:
    pins: tuple[tuple[str, object], ...]

    @property
    def key(self) -> str:
        return ",".join(f"{k}={_text(v)}" for k, v in self.pins)


def _text(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def full_space(
    graph: Graph, profile: Profile, *, devices: int, batch: int, precisions: tuple[str, ...]
) -> list[Config]:
    """Every configuration of solve/space.py for this graph (precisions restricted to ``precisions``)."""
    layers, out = len(graph.layers), []
    seq_lens = sequence_parallel.sequence_lengths(graph)
    for deg in space.degree_options(
        devices=devices, per_node=profile.devices_per_node, layers=layers, batch=batch, fixes={}
    ):
        for precision in [p for p in space.precision_options(profile, fixes={}) if p in precisions]:
            for sp in sequence_parallel.sp_options(tp=deg.tp, seq_lens=seq_lens, fixes={}):
                for mbs in space.micro_batch_options(batch=batch, dp=deg.dp, fixes={}):
                    m = batch // (deg.dp * mbs)
                    for schedule, v in space.schedule_options(pp=deg.pp, layers=layers, num_microbatches=m, fixes={}):
                        for zero in space.zero_options(dp=deg.dp, fixes={}):
                            for recompute in space.recompute_options(fixes={}, layers=layers):
                                out.append(
                                    Config(
                                        (
                                            ("dp", deg.dp),
                                            ("tp", deg.tp),
                                            ("pp", deg.pp),
                                            ("mbs", mbs),
                                            ("schedule", schedule),
                                            ("v", v),
                                            ("zero", zero),
                                            ("recompute", recompute),
                                            ("sp", sp),
                                            ("precision", precision),
                                        )
                                    )
                                )
    return out


def select(configs: list[Config], *, name: str, batch: int) -> list[Config]:
    """The ``default`` or ``quick`` subset of the full space (module docstring)."""
    if name == "full":
        return configs
    chosen, seen_degree = [], set()
    for config in configs:
        pins = dict(config.pins)
        m = batch // (pins["dp"] * pins["mbs"])
        if pins["recompute"] != "none" or m not in (PIPELINE_MICROBATCHES if pins["pp"] > 1 else (1,)):
            continue
        if name == "quick":
            degree = (pins["dp"], pins["tp"], pins["pp"], pins["precision"])
            if degree in seen_degree or pins["sp"] or pins["zero"] or pins["schedule"] != "1f1b" or m not in (1, 4):
                continue
            seen_degree.add(degree)
        chosen.append(config)
    return chosen + (_recompute_variants(configs, batch=batch) if name == "default" else [])


def _recompute_variants(configs: list[Config], *, batch: int) -> list[Config]:
    """For each degree and precision: its first plain plan with every other recomputation choice."""
    out, seen = [], set()
    for config in configs:
        pins = dict(config.pins)
        m = batch // (pins["dp"] * pins["mbs"])
        if (
            pins["recompute"] == "none"
            or pins["sp"]
            or pins["zero"]
            or pins["schedule"] == "gpipe"
            or m != (4 if pins["pp"] > 1 else 1)
        ):
            continue
        key = (pins["dp"], pins["tp"], pins["pp"], pins["precision"], pins["recompute"])
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


def make_plan(graph: Graph, profile: Profile, config: Config, *, devices: int, batch: int) -> Plan | None:
    """The planner's plan for a fully pinned configuration, or None when it does not fit or is illegal."""
    try:
        result = plan_graph(graph, devices=devices, profile=profile, batch_size=batch, fix=dict(config.pins))
    except PlanError:
        return None
    return result.best


def chosen_plan(graph: Graph, profile: Profile, *, devices: int, batch: int, precisions: tuple[str, ...]) -> Plan:
    """What `autoplan plan` picks over the benchmark's precisions (pinned when there is one)."""
    fix = {"precision": precisions[0]} if len(precisions) == 1 else {}
    return plan_graph(graph, devices=devices, profile=profile, batch_size=batch, fix=fix).best


def config_key(plan: Plan) -> str:
    pins = (
        ("dp", plan.dp),
        ("tp", plan.tp),
        ("pp", plan.pp),
        ("mbs", plan.micro_batch_size),
        ("schedule", plan.schedule),
        ("v", plan.virtual_stages),
        ("zero", plan.zero_stage),
        ("recompute", plan.recompute),
        ("sp", plan.sequence_parallel),
        ("precision", plan.precision),
    )
    return Config(pins).key
