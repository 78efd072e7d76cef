"""An existing config priced beside the best plan for the same model, devices and global batch
(``autoplan explain --config``; docs/export.md, and "Reading a config back" on each framework's
page, docs/export-*.md).

1. **The config is for the model.** What the config states of the model (layers, hidden size,
   attention heads, KV heads, sequence length, vocabulary: :class:`ModelFacts`) must equal what
   the trace recorded, or the config is refused in one sentence (:func:`check_facts`). A field the
   config does not state, or the trace does not record, is not compared and is named among the
   assumptions. Megatron-LM pads the vocabulary it is given to a multiple of
   ``make-vocab-size-divisible-by x tp``, so either the stated or the padded size matches.
2. **Like for like.** Both are priced for the framework's runtime (export/runtime_price.py:
   a Megatron-LM config as Megatron-Core runs it). The best plan is searched with the config's own precision and
   gradient-reduction dtype pinned (``--fix precision=..,reduce=..``; a pin the user gives wins),
   so that the ratio measures the parallel layout, not a change of numerics. A lossy reduction the
   config itself makes is pinned as the config's choice, not searched.
3. **What a change of precision would add.** The best plan with only the user's ``--fix`` and
   ``--allow-*`` options, on a separate line, when it differs from the like-for-like one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoplan.display import duration_text
from autoplan.errors import AutoplanError, ExportError
from autoplan.export.common import Imported, ModelFacts
from autoplan.export.runtime_price import FRAMEWORK_RUNTIME
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

#: The model facts compared, in the words the output uses.
FACT_WORDS = {
    "layers": "layers",
    "hidden_size": "hidden size",
    "num_heads": "attention heads",
    "num_kv_heads": "KV heads",
    "seq_len": "sequence length",
    "vocab_size": "vocabulary",
}


def check_facts(imported: Imported, graph: Graph, *, source: str, model: str) -> list[str]:
    """Refuse a config written for another model (module docstring, 1); else the assumption lines
    for the facts that could not be compared."""
    stated, traced = imported.facts, ModelFacts.from_graph(graph)
    wrong, unstated, untraced = [], [], []
    for name, words in FACT_WORDS.items():
        ours, theirs = getattr(stated, name), getattr(traced, name)
        if ours is None:
            unstated.append(words)
        elif theirs is None:
            untraced.append(f"{words} {ours}")
        elif not _same(name, ours, theirs, imported.vocab_multiple):
            wrong.append(f"{words} {ours} in the config, {theirs} in the model")
    if wrong:
        raise ExportError(
            f"'{source}' is for another model than '{model}' ({'; '.join(wrong)}); pass --model the model file "
            "this config trains, or price a config written for this model."
        )
    lines = [f"not stated in the config, so not compared (priced as the model has them): {', '.join(unstated)}."]
    lines += [f"not recorded by the trace, so not compared: {', '.join(untraced)}."] if untraced else []
    return lines if unstated else lines[1:]


def _same(name: str, stated: int, traced: int, vocab_multiple: int) -> bool:
    """Equal, or for the vocabulary equal once padded as the framework pads it (module docstring)."""
    padded = -(-stated // vocab_multiple) * vocab_multiple
    return stated == traced or (name == "vocab_size" and padded == traced)


@dataclass
class ConfigPricing:
    """An existing config beside the best plan for the same devices and batch (module docstring)."""

    framework: str
    config_plan: Plan
    config_step_s: float
    config_feasible: bool
    config_reason: str
    best_plan: Plan  # like for like: at the config's precision and reduction dtype
    best_step_s: float
    compared_at: dict[str, str] = field(default_factory=dict)  # the pins that made it like for like
    note: str = ""  # why the comparison is not like for like, when it cannot be
    any_plan: Plan | None = None  # the best with only the user's pins: what a change of precision would add
    any_step_s: float | None = None
    unmapped: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    terms: list[dict[str, Any]] = field(default_factory=list)  # report/terms.term_diffs, config minus best
    fp8_recipe: str = ""  # what Transformer Engine's FP8 recipe saves over torchao's (report/fp8.py te_saving)

    @property
    def slower(self) -> float:
        """The config's step time over the best plan's."""
        return self.config_step_s / self.best_step_s if self.best_step_s else 1.0

    def to_dict(self) -> dict[str, Any]:
        other = None
        if self.any_plan is not None:
            other = {"plan": self.any_plan.describe(), "step_s": self.any_step_s}
        return {
            "framework": self.framework,
            "config_plan": self.config_plan.describe(),
            "config_step_s": self.config_step_s,
            "config_feasible": self.config_feasible,
            "config_reason": self.config_reason,
            "best_plan": self.best_plan.describe(),
            "best_step_s": self.best_step_s,
            "slower": self.slower,
            "compared_at": self.compared_at,
            "note": self.note,
            "any_precision": other,
            "unmapped": self.unmapped,
            "assumptions": self.assumptions,
            "terms": self.terms,
            "fp8_recipe": self.fp8_recipe,
        }


def price_imported(
    imported: Imported,
    *,
    graph: Graph,
    profile: Profile,
    search: dict[str, Any] | None = None,
    source: str = "the config",
    model: str | None = None,
) -> ConfigPricing:
    """Price a config already read (export/api.import_config) beside the best plan (module docstring).
    ``search`` holds ``plan_graph``'s ``fix`` and ``allow_*`` options (the ``plan`` command's flags)."""
    from autoplan.cost import CostModel
    from autoplan.report.fp8 import te_saving
    from autoplan.report.terms import term_diffs

    assumptions = imported.assumptions + check_facts(imported, graph, source=source, model=model or graph.model_name)
    try:  # the plan's own checks, and the cost model's for this model (which cp it can split: cost/cp/)
        runtime = FRAMEWORK_RUNTIME.get(imported.framework, "autoplan")  # priced as its framework runs it
        plan = Plan(**{"runtime": runtime, **imported.fields, "model": graph.model_name, "profile": profile.name})
        cost = CostModel(graph, profile).estimate(plan)
    except AutoplanError as exc:
        raise ExportError(f"'{source}' describes a plan autoplan cannot price: {exc}") from None
    best, other, compared_at, note = _best_plans(graph, profile, plan, dict(search or {}))
    return ConfigPricing(
        framework=imported.framework,
        config_plan=plan,
        config_step_s=cost.step_time_s,
        config_feasible=cost.feasible,
        config_reason=cost.reason,
        best_plan=best.best,
        best_step_s=best.best_cost.step_time_s,
        compared_at=compared_at,
        note=note,
        any_plan=other.best if other else None,
        any_step_s=other.best_cost.step_time_s if other else None,
        unmapped=imported.unmapped,
        assumptions=assumptions,
        terms=[
            {"term": d.term, "words": d.words, "config_s": d.rival_s, "best_s": d.best_s}
            for d in term_diffs(best.best_cost, cost)
        ],
        fp8_recipe=te_saving(plan, graph=graph, profile=profile) if plan.runtime == "megatron" else "",
    )


def _best_plans(graph: Graph, profile: Profile, plan: Plan, options: dict[str, Any]):
    """(like-for-like best, faster best at other numerics or None, the numerics pinned, a note) for
    the config's ``plan`` (module docstring, 2 and 3); ``options``: ``plan_graph``'s fix and allow_*."""
    from autoplan.solve.pins import parse_fixes

    fixes = parse_fixes(options.pop("fix", None))
    same = {"precision": plan.precision, "reduce": plan.grad_reduce_dtype}
    pins = {key: value for key, value in same.items() if key not in fixes}  # the user's pins win
    compared_at = {**{key: value for key, value in fixes.items() if key in same}, **pins}
    lossy = options.get("allow_lossy", False) or plan.grad_reduce_dtype != "fp32"  # the config's own reduction
    best = _search(graph, profile, plan, {**options, "allow_lossy": lossy}, {**fixes, **pins})
    if best is None:  # the search builds no plan at the config's numerics (a precision it does not offer)
        note = f"no plan the search builds fits at your config's {_words(pins)}; compared at any precision"
        return _search(graph, profile, plan, options, fixes, strict=True), None, {}, note
    other = _search(graph, profile, plan, options, fixes) if pins else None
    if other is None or other.best_cost.step_time_s >= best.best_cost.step_time_s:
        return best, None, compared_at, ""
    return best, (None if _numerics(other.best) == _numerics(best.best) else other), compared_at, ""


def _search(graph: Graph, profile: Profile, plan: Plan, options: dict[str, Any], fixes: dict, *, strict=False):
    """The planner's best for the config's devices and global batch under ``fixes``; None when
    nothing fits (``strict``: the planner's own sentence)."""
    from autoplan.errors import PlanError
    from autoplan.solve.api import plan_graph

    try:
        return plan_graph(
            graph,
            devices=plan.devices,
            profile=profile,
            batch_size=plan.global_batch_size,
            fix=fixes,
            runtime=plan.runtime,
            **options,
        )
    except PlanError:
        if strict:
            raise
        return None


def _numerics(plan: Plan) -> tuple[str, str]:
    return plan.precision, plan.grad_reduce_dtype


def _words(pins: dict[str, str]) -> str:
    return " and ".join(f"{'gradient reduction' if k == 'reduce' else k} {v}" for k, v in pins.items())


def pricing_lines(result: ConfigPricing) -> list[str]:
    """The comparison as Markdown lines."""
    fits = "" if result.config_feasible else f" (does not fit: {result.config_reason})"
    at = _words(result.compared_at)
    lines = [
        f"## Your {result.framework} config against the best plan",
        "",
        f"- your config: **{result.config_plan.describe()}**, {_duration(result.config_step_s)} per step{fits}",
        f"- best plan{f' at your {at}' if at else ''}: **{result.best_plan.describe()}**, "
        f"{_duration(result.best_step_s)} per step",
        f"- your config is {result.slower:.2f}x the best plan's step time",
        *_lossy_line(result),
        _precision_line(result),
        *([f"- {result.fp8_recipe}"] if result.fp8_recipe else []),
        "",
        "| term | yours | best | difference |",
        "|---|---:|---:|---:|",
    ]
    for t in result.terms:
        if t["config_s"] or t["best_s"]:
            diff = duration_text(t["config_s"] - t["best_s"], signed=True)
            lines.append(f"| {t['words']} | {_duration(t['config_s'])} | {_duration(t['best_s'])} | {diff} |")
    if result.unmapped:
        lines += ["", "Not priced (autoplan has no term for them):", ""] + [f"- {u}" for u in result.unmapped]
    if result.assumptions:
        lines += ["", "Assumed in reading the config:", ""] + [f"- {a}" for a in result.assumptions]
    return lines


def _lossy_line(result: ConfigPricing) -> list[str]:
    plan = result.config_plan
    if not plan.lossy or result.compared_at.get("reduce") != plan.grad_reduce_dtype:
        return []
    return [f"- your config is lossy ({', '.join(plan.lossy)}); the best plan is compared with the same reduction"]


def _precision_line(result: ConfigPricing) -> str:
    """What a change of precision would add (module docstring, 3), in one line."""
    if result.note:
        return f"- {result.note}"
    if result.any_plan is None:
        return "- another precision or reduction would not be faster (among those the search allows)"
    gain = result.best_step_s / result.any_step_s
    return (
        f"- a change of precision would add: **{result.any_plan.describe()}**, "
        f"{_duration(result.any_step_s)} per step, "
        f"{gain:.2f}x faster than the best plan above ({result.config_step_s / result.any_step_s:.2f}x your config)"
    )


def _duration(seconds: float) -> str:
    """A duration as the rest of autoplan prints one (autoplan/display.py): ``91.9 ms``, ``40.2 ns``."""
    return duration_text(seconds)
