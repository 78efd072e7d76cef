"""Plans out to trainers' configs, and configs back in to be priced (docs/export.md).

- :func:`export_plan`: a plan (a Plan, a ``plan.json`` or a plan folder, whose ``graph.json``
  gives the model facts) to one framework's config (autoplan/export/<framework>.py);
- :func:`import_config`: a framework's config file back to plan fields; the framework is taken
  from ``framework`` or recognised from the file (a ``.toml`` or a ``.py`` naming torchtitan is
  torchtitan's, a ``.json`` with
  ``train_batch_size`` or ``zero_optimization`` DeepSpeed's, a ``.yaml`` with
  ``distributed_type`` Accelerate's, a file of ``--flags`` Megatron-LM's);
- :func:`price_config`: how far an existing config is from the best plan: the config's plan and
  the planner's best for the same devices and global batch, both priced by the cost model, with
  their term-by-term difference (autoplan/report/terms.py).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.errors import AutoplanError, ExportError
from autoplan.export.common import FRAMEWORKS, Exported, Imported, ModelFacts
from autoplan.types._check import write_text_atomic
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan, plan_json
from autoplan.types.profile import Profile


def _module(framework: str):
    if framework not in FRAMEWORKS:
        raise ExportError(
            f"--to {framework!r} is not a framework autoplan exports to; use one of {', '.join(FRAMEWORKS)}."
        )
    return importlib.import_module(f"autoplan.export.{framework}")


def load_plan(source: Plan | str | Path) -> tuple[Plan, Graph | None]:
    """A Plan and, for a plan folder, its traced graph (the model facts)."""
    if isinstance(source, Plan):
        return source, None
    plan_file = plan_json(source)
    if not plan_file.is_file():
        raise ExportError(
            f"'{source}' is neither a plan.json nor a plan folder; pass the --out DIR of `autoplan plan`."
        )
    graph_file = plan_file.parent / "graph.json"
    plan, graph = Plan.load(plan_file), Graph.load(graph_file) if graph_file.is_file() else None
    if graph is not None and plan.graph_signature and graph.signature != plan.graph_signature:
        raise ExportError(
            f"'{plan_file}' was made for another model than the graph.json beside it (graph signature "
            f"{plan.graph_signature}, not {graph.signature}); export the plan from the folder `autoplan plan` "
            "wrote it to."
        )
    return plan, graph


def export_plan(source: Plan | str | Path, *, to: str, graph: Graph | None = None, fmt: str | None = None) -> Exported:
    """The plan as ``to``'s own config (module docstring); what it cannot express is in ``unexpressed``.
    ``fmt`` picks torchtitan's format: ``py`` (0.3 and later, the default) or ``toml`` (0.2.x)."""
    module = _module(to)
    if fmt is not None and to != "torchtitan":
        raise ExportError(f"--format chooses torchtitan's format (py or toml); {to} has one format, leave it out.")
    plan, found = load_plan(source)
    options = {"fmt": fmt} if fmt else {}
    return module.export(plan, ModelFacts.from_graph(graph or found), **options)


def write_export(exported: Exported, out: str | Path | None) -> Path:
    """Write the config atomically to ``out`` (a file, or a folder for the framework's file name)."""
    path = Path(out) if out else Path(exported.filename)
    if path.is_dir():
        path = path / exported.filename
    return write_text_atomic(path, exported.text)


def detect_framework(path: Path, text: str) -> str:
    """The framework a config file belongs to (module docstring), or one sentence."""
    suffix = path.suffix.lower()
    if suffix == ".toml" or (suffix == ".py" and "torchtitan" in text):  # 0.2's TOML, 0.3's config functions
        return "torchtitan"
    if suffix in (".yaml", ".yml") and "distributed_type" in text:
        return "accelerate"
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ExportError(f"'{path}' is not valid JSON ({exc.msg} at line {exc.lineno}).") from None
        if isinstance(data, dict) and ({"train_batch_size", "zero_optimization"} & set(data)):
            return "deepspeed"
    if any(token.startswith("--") for token in text.split()):
        return "megatron"
    raise ExportError(f"cannot tell which framework '{path}' is for; pass --framework one of {', '.join(FRAMEWORKS)}.")


def import_config(
    path: str | Path, *, framework: str | None = None, devices: int | None = None, batch_size: int | None = None
) -> Imported:
    """A framework's config file read back into plan fields (module docstring). ``devices`` and
    ``batch_size`` (the global batch) fill in what a config leaves to its launcher or script."""
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"config '{path}' does not exist; pass the trainer's config file.")
    text = path.read_text()
    name = framework or detect_framework(path, text)
    hints = {"batch_size": batch_size} if batch_size and name == "accelerate" else {}  # its script holds the batch
    try:
        return _module(name).read(text, devices=devices, **hints)
    except AutoplanError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"'{path}' is not a {name} config autoplan can read ({exc}).") from None


@dataclass
class ConfigPricing:
    """An existing config beside the best plan for the same devices and batch."""

    framework: str
    config_plan: Plan
    config_step_s: float
    config_feasible: bool
    config_reason: str
    best_plan: Plan
    best_step_s: float
    unmapped: list[str] = field(default_factory=list)
    allow_lossy: bool = False  # the best plan's search could pick lossy options
    terms: list[dict[str, Any]] = field(default_factory=list)  # report/terms.term_diffs, config minus best

    @property
    def slower(self) -> float:
        """The config's step time over the best plan's."""
        return self.config_step_s / self.best_step_s if self.best_step_s else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "config_plan": self.config_plan.describe(),
            "config_step_s": self.config_step_s,
            "config_feasible": self.config_feasible,
            "config_reason": self.config_reason,
            "best_plan": self.best_plan.describe(),
            "best_step_s": self.best_step_s,
            "slower": self.slower,
            "unmapped": self.unmapped,
            "terms": self.terms,
        }


def price_config(
    path: str | Path,
    *,
    graph: Graph,
    profile: Profile,
    framework: str | None = None,
    devices: int | None = None,
    batch_size: int | None = None,
    allow_lossy: bool = False,
) -> ConfigPricing:
    """Price an existing config and the planner's best plan for its devices and batch (module docstring)."""
    imported = import_config(path, framework=framework, devices=devices, batch_size=batch_size)
    return price_imported(imported, graph=graph, profile=profile, allow_lossy=allow_lossy, source=str(path))


def price_imported(
    imported: Imported, *, graph: Graph, profile: Profile, allow_lossy: bool = False, source: str = "the config"
) -> ConfigPricing:
    """:func:`price_config` for a config already read (:func:`import_config`)."""
    from autoplan.cost.model import CostModel
    from autoplan.report.terms import term_diffs
    from autoplan.solve.api import plan_graph

    fields = {**imported.fields, "model": graph.model_name, "profile": profile.name}
    try:
        plan = Plan(**fields)
    except AutoplanError as exc:
        raise ExportError(f"'{source}' describes a plan autoplan cannot price: {exc}") from None
    cost = CostModel(graph, profile).estimate(plan)
    best = plan_graph(
        graph, devices=plan.devices, profile=profile, batch_size=plan.global_batch_size, allow_lossy=allow_lossy
    )
    diffs = term_diffs(best.best_cost, cost)
    return ConfigPricing(
        framework=imported.framework,
        config_plan=plan,
        config_step_s=cost.step_time_s,
        config_feasible=cost.feasible,
        config_reason=cost.reason,
        best_plan=best.best,
        best_step_s=best.best_cost.step_time_s,
        unmapped=imported.unmapped,
        allow_lossy=allow_lossy,
        terms=[{"term": d.term, "words": d.words, "config_s": d.rival_s, "best_s": d.best_s} for d in diffs],
    )


def pricing_lines(result: ConfigPricing) -> list[str]:
    """The comparison as Markdown lines."""
    fits = "" if result.config_feasible else f" (does not fit: {result.config_reason})"
    lines = [
        f"## Your {result.framework} config against the best plan",
        "",
        f"- your config: **{result.config_plan.describe()}**, {1e3 * result.config_step_s:.1f} ms per step{fits}",
        f"- best plan: **{result.best_plan.describe()}**, {1e3 * result.best_step_s:.1f} ms per step",
        f"- your config is {result.slower:.2f}x the best plan's step time",
        *(
            [
                f"- your config is lossy ({', '.join(result.config_plan.lossy)}); the best plan was searched "
                f"{'with' if result.allow_lossy else 'without'} lossy options"
            ]
            if result.config_plan.lossy
            else []
        ),
        "",
        "| term | yours ms | best ms | difference ms |",
        "|---|---:|---:|---:|",
    ]
    for t in result.terms:
        if t["config_s"] or t["best_s"]:
            diff = 1e3 * (t["config_s"] - t["best_s"])
            lines.append(f"| {t['words']} | {1e3 * t['config_s']:.1f} | {1e3 * t['best_s']:.1f} | {diff:+.1f} |")
    if result.unmapped:
        lines += ["", "Not priced (autoplan has no term for them):", ""] + [f"- {u}" for u in result.unmapped]
    return lines
