"""Plans out to trainers' configs, and configs back in to be priced (docs/export.md).

- :func:`export_plan`: a plan (a Plan, a ``plan.json`` or a plan folder, whose ``graph.json``
  gives the model facts) to one framework's config (autoplan/export/<framework>.py);
- :func:`import_config`: a framework's config file back to plan fields; the framework is taken
  from ``framework`` or recognised from the file (a ``.toml`` or a ``.py`` naming torchtitan is
  torchtitan's, a ``.json`` with
  ``train_batch_size`` or ``zero_optimization`` DeepSpeed's, a ``.yaml`` with
  ``distributed_type`` Accelerate's, a file of ``--flags`` Megatron-LM's);
- :func:`price_config`: how far an existing config is from the best plan: the config's plan and
  the planner's best for the same model, devices, global batch and numerics, both priced by the
  cost model, with their term-by-term difference (autoplan/export/pricing.py).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from autoplan.errors import AutoplanError, ExportError
from autoplan.export.common import FRAMEWORKS, Exported, Imported, ModelFacts
from autoplan.export.pricing import ConfigPricing, price_imported
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
    """Write the config atomically to ``out``: a file, or a folder for the framework's file name
    (an existing folder, or a path ending in a slash, which names a folder even before it exists)."""
    path = Path(out or exported.filename)
    if out and (path.is_dir() or str(out).endswith(("/", os.sep))):
        path = path / exported.filename
    if _is_module(exported):
        from autoplan.export.torchtitan_py import check_module_path

        check_module_path(path)
    text = exported.text  # the file's own launch line names where it is written, as the printed one does
    if exported.launch:  # (replacing "" would put the command between every character)
        text = text.replace(exported.launch, launch_for(exported, path))
    return write_text_atomic(path, text)


def launch_for(exported: Exported, path: str | Path) -> str:
    """The framework's launch command naming the file written at ``path`` rather than the
    default file name it was built with (each exporter's command names ``exported.filename``;
    torchtitan 0.3 names a module: :func:`autoplan.export.torchtitan_py.launch_for_module`)."""
    if _is_module(exported):
        from autoplan.export.torchtitan_py import launch_for_module

        return launch_for_module(exported.launch, Path(path))
    return re.sub(
        rf"(?<![\w./-]){re.escape(exported.filename)}(?![\w.-])", lambda _: shlex.quote(str(path)), exported.launch
    )


def _is_module(exported: Exported) -> bool:
    """A config the framework imports as a Python module (torchtitan 0.3) rather than reads as a file."""
    return exported.framework == "torchtitan" and exported.filename.endswith(".py")


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
    ``batch_size`` (the global batch) fill in what a config leaves to its launcher or script; each
    value filled in, and a ``devices`` or ``batch_size`` the config overrides, is in ``assumptions``."""
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"config '{path}' does not exist; pass the trainer's config file.")
    text = path.read_text()
    name = framework or detect_framework(path, text)
    try:
        imported = _module(name).read(text, devices=devices, batch_size=batch_size)
    except AutoplanError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"'{path}' is not a {name} config autoplan can read ({exc}).") from None
    imported.assumptions += _unused(imported, devices=devices, batch_size=batch_size)
    return imported


def _unused(imported: Imported, *, devices: int | None, batch_size: int | None) -> list[str]:
    """A --devices or --batch that the config overrides, one sentence each."""
    fields, found = imported.fields, []
    batch = fields["dp"] * fields["micro_batch_size"] * fields["num_microbatches"]
    if devices is not None and devices != fields["devices"]:
        found.append(f"--devices {devices} not used: the config states world size {fields['devices']}.")
    if batch_size is not None and batch_size != batch:
        found.append(f"--batch {batch_size} not used: the config gives a global batch of {batch}.")
    return found


def price_config(
    path: str | Path,
    *,
    graph: Graph,
    profile: Profile,
    framework: str | None = None,
    devices: int | None = None,
    batch_size: int | None = None,
    **search: Any,
) -> ConfigPricing:
    """Price an existing config and the planner's best plan for its devices and batch (module
    docstring); ``search``: the planner's ``fix`` and ``allow_*`` options (``plan_graph``'s)."""
    imported = import_config(path, framework=framework, devices=devices, batch_size=batch_size)
    return price_imported(imported, graph=graph, profile=profile, search=search, source=str(path))
