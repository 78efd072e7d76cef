"""A plan as a torchtitan 0.3 Python config function (``autoplan export --to torchtitan``, the
default format), and such a file read back (the plan-field-to-config table: docs/export-torchtitan.md,
"The 0.3 mapping").

The exporter writes ``autoplan_torchtitan.py``, whose ``autoplan_plan()`` starts from the recipe
of the traced model's flavour (torchtitan_flavours.py) and sets the plan's fields; where no flavour
matches it raises with the sentence that says what to set. :func:`read` reads such a file, or a
recipe written the way torchtitan's own are, without running it: keyword arguments of
``TrainingConfig``, ``ParallelismConfig`` and ``CompileConfig`` calls and ``config.<section>.<field>
= value`` assignments, in source order, go to the TOML reader's table (torchtitan_toml.read_data).

Context parallelism is ``context_parallel_degree`` with head-tail load balancing. 0.3's language
models attend with FlexAttention, whose cp all-gathers keys and values (torchtitan refuses SDPA for
them), so allgather is the one variant it runs; :func:`read` says so of a ``set_rotate_method`` call,
which only torch's SDPA path reads.
"""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path
from typing import Any

from autoplan.export.common import Exported, ExportError, Imported, ModelFacts, comment_lines, frozen_notes
from autoplan.export.offload import torchtitan_training
from autoplan.export.recompute_budget import every_block_note
from autoplan.export.torchtitan import (
    chunk_modules,
    chunk_sizes,
    context_parallel,
    general_notes,
    launch,
    nodes_note,
    pick_flavour,
    pipeline_schedule,
    precision_notes,
    training_batch,
)
from autoplan.export.torchtitan_flavours import Flavour, Registry
from autoplan.types.hsdp import dp_shard
from autoplan.types.plan import Plan

MODULE, FUNCTION = "autoplan_torchtitan", "autoplan_plan"
FILENAME = f"{MODULE}.py"
# 0.3's names for the modules before the first and after the last block, where its registry is not installed
END_MODULES_03 = (["tok_embeddings"], ["norm", "lm_head"])
AC_CLASSES = {"selective": "SelectiveAC.Config()", "full": "FullAC.Config()", "none": "None"}
FLOAT8_CONVERTER = "Float8LinearConverter.Config(model_compile_enabled=True)"
SELECTIVE = {"mode": "selective", "selective_ac_option": "op"}  # 0.3's SelectiveAC is per-op SAC


# ---- export ------------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts, *, registry: Registry) -> Exported:
    """The plan as a torchtitan 0.3 config function (module docstring)."""
    notes: list[str] = []
    remarks: list[str] = []
    flavour, why = pick_flavour(registry, facts, "py")
    if flavour is not None and flavour.recipe is None:
        why = (
            f"torchtitan {registry.version} has {flavour.module} {flavour.flavor} (the traced shape) but no recipe "
            "for it in its config_registry to start from; set RECIPE to a config function that trains it."
        )
    if why:
        notes.append(why)
    if why and plan.precision == "fp8":
        remarks.append(f"float8: build your model_spec with converters=[{FLOAT8_CONVERTER}].")
    settings = {
        "training": _training(plan, facts, notes, remarks),
        "parallelism": _parallelism(plan, facts, registry, notes),
    }
    if plan.precision == "fp8":
        notes.append("float8: torchtitan 0.3 scales float8 rowwise only; autoplan priced tensorwise scaling.")
    if plan.recompute_blocks:  # FullAC and SelectiveAC wrap every block (export/recompute_budget.py)
        notes.append(every_block_note(plan, trainer="torchtitan 0.3", how="wraps every block in FullAC or SelectiveAC"))
    notes += general_notes(plan) + frozen_notes(facts, "torchtitan")
    command = launch(plan.devices, f"--module {MODULE} --config {FUNCTION}")
    body = _body(plan, flavour, why, settings)
    text = _render(plan, flavour, command, body, notes=notes, remarks=remarks)
    return Exported(framework="torchtitan", filename=FILENAME, text=text, unexpressed=notes, launch=command)


def _training(plan: Plan, facts: ModelFacts, notes: list[str], remarks: list[str]) -> dict[str, Any]:
    out = training_batch(plan, facts, remarks, seq_len_key="config.training.seq_len")
    out |= torchtitan_training(plan, notes)  # FSDP2's CPU offload (export/offload.py)
    if plan.pp > 1 or plan.ep > 1:  # Trainer.Config refuses CUDA graphs with PP, and with EP's dispatchers
        out["disable_cuda_graphs"] = True
    notes += precision_notes(plan, series="0.3")
    return out


def _parallelism(plan: Plan, facts: ModelFacts, registry: Registry, notes: list[str]) -> dict[str, Any]:
    if (plan.dp > 1 and plan.zero_stage > 0) or plan.cp > 1:  # torchtitan shards over dp_shard x cp
        out: dict[str, Any] = {  # HSDP: replicas of FSDP over a shard group (types/hsdp.py)
            "data_parallel_replicate_degree": plan.dp_replicate,
            "data_parallel_shard_degree": dp_shard(plan),
        }
        out["fsdp_reshard_after_forward"] = "always" if plan.zero_stage == 3 else "never"
        if plan.zero_stage == 1 and plan.cp == 1:
            notes.append(
                "ZeRO-1 (only optimizer states sharded) has no torchtitan equivalent; written as FSDP without "
                "resharding after forward (ZeRO-2-like), which shards gradients."
            )
    else:
        out = {"data_parallel_replicate_degree": plan.dp, "data_parallel_shard_degree": 1}
    out["tensor_parallel_degree"] = plan.tp
    if plan.tp > 1:
        out["enable_sequence_parallel"] = plan.sequence_parallel
    out.update(context_parallel(plan, facts, notes, series="0.3"))
    out["expert_parallel_degree"] = plan.ep
    out["pipeline_parallel_degree"] = plan.pp
    if plan.pp > 1:
        out.update(_pipeline(plan, facts, registry, notes))
    return out


def _pipeline(plan: Plan, facts: ModelFacts, registry: Registry, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pipeline_parallel_schedule": pipeline_schedule(plan, notes),
        "pipeline_parallel_microbatch_size": plan.micro_batch_size,
    }
    sizes = chunk_sizes(plan, facts, notes)
    if sizes is None:
        return out
    installed = registry.version.startswith("0.3") and registry.input_modules
    first, last = (registry.input_modules, registry.output_modules) if installed else END_MODULES_03
    out["module_fqns_per_model_part"] = chunk_modules(sizes, first, last)
    return out


def _body(plan: Plan, flavour: Flavour | None, why: str | None, settings: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"def {FUNCTION}():"]
    if why:
        message = f"autoplan: {why} Set RECIPE above to its config function, then remove this line."
        lines += [f"    raise ValueError({_literal(message)})"]
        lines += ["    config = RECIPE()  # set RECIPE: your model's config function"]
    else:
        lines += [f"    config = RECIPE()  # torchtitan's recipe for {flavour.module} {flavour.flavor}"]
    if flavour is not None:  # the flavour with the plan's converters only, whatever the recipe converts
        converters = f", converters=[{FLOAT8_CONVERTER}]" if plan.precision == "fp8" else ""
        lines += [f"    config.model_spec = model_registry({_literal(flavour.flavor)}{converters})"]
    for section, fields in settings.items():
        lines += [line for key, value in fields.items() for line in _assignment(f"config.{section}.{key}", value)]
    lines += [f"    config.activation_checkpoint = {AC_CLASSES[plan.recompute]}"]
    if plan.compile or plan.tp_comm_overlap or plan.precision == "fp8":  # the plan's; async TP needs it; float8 too
        overlap = ", enable_async_tensor_parallel=True" if plan.tp_comm_overlap else ""
        lines += [f'    config.compile = CompileConfig(enable=True, components=["model", "loss"]{overlap})']
    else:  # the recipe's compile stays; async TP is priced, so it follows the plan
        lines += ["    config.compile.enable_async_tensor_parallel = False"]
    return lines + ["    return config"]


def _assignment(target: str, value: Any) -> list[str]:
    """``target = value`` as Python; a list of lists (the chunks' modules) one inner list a line."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [f"    {target} = ["] + [f"        {_literal(inner)}," for inner in value] + ["    ]"]
    return [f"    {target} = {_literal(value)}"]


def _literal(value: Any) -> str:
    """A Python literal as ruff formats it: strings in double quotes (JSON's escapes are Python's)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)  # ints, bools, None


def _imports(plan: Plan, flavour: Flavour | None) -> list[str]:
    lines = []
    if plan.tp_comm_overlap or plan.precision == "fp8":
        lines += ["from torchtitan.config import CompileConfig"]
    if plan.recompute != "none":
        policy = AC_CLASSES[plan.recompute].removesuffix(".Config()")
        lines += [f"from torchtitan.distributed.activation_checkpoint import {policy}"]
    if plan.precision == "fp8" and flavour is not None:
        lines += ["from torchtitan.components.quantization import Float8LinearConverter"]
    if flavour is not None:
        lines += [f"from torchtitan.models.{flavour.module} import model_registry"]
    if flavour is None or flavour.recipe is None:
        return lines + ["", "RECIPE = None  # e.g. from torchtitan.models.llama3.config_registry import llama3_8b"]
    lines += [f"from torchtitan.models.{flavour.module}.config_registry import {flavour.recipe} as RECIPE"]
    return lines


def _render(
    plan: Plan, flavour: Flavour | None, command: str, body: list[str], *, notes: list[str], remarks: list[str]
) -> str:
    header = [f"torchtitan 0.3 config written by autoplan for: {plan.describe()}", f"launch: {command}"]
    header += ["(run it where Python finds this file as a module: its folder, or that folder on PYTHONPATH)"]
    comments = [f"# {h}" for h in header + nodes_note(plan.devices)]
    comments += comment_lines("torchtitan", notes=notes, remarks=remarks)
    return "\n".join(comments + [""] + _imports(plan, flavour) + ["", ""] + body) + "\n"


# ---- read --------------------------------------------------------------------------------------
def looks_like_python(text: str) -> bool:
    """A Python config function rather than TOML: it defines a function or imports torchtitan."""
    return any(line.startswith(("def ", "from torchtitan", "import torchtitan")) for line in text.splitlines())


def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """A torchtitan 0.3 config function read back into Plan fields, without running it (module docstring)."""
    from autoplan.export.torchtitan_toml import FLOAT8, read_data

    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise ExportError(f"not valid Python: {exc.msg} at line {exc.lineno}.") from None
    # torchtitan 0.3's Trainer.Config default is op-level selective AC
    data: dict[str, Any] = {"parallelism": {}, "training": {}, "activation_checkpoint": SELECTIVE}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            _read_call(node, data)
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        _read_assign(node, data)
    if data.pop("float8", None) is not None:
        data["model"] = {"converters": [FLOAT8]}
    compile_ = data.get("compile", {})  # enable: Plan.compile (read_data)
    data["parallelism"].setdefault("enable_async_tensor_parallel", compile_.get("enable_async_tensor_parallel", False))
    return read_data(data, devices=devices, series="0.3", batch_size=batch_size)


def _read_call(call: ast.Call, data: dict[str, Any]) -> None:
    name = ast.unparse(call.func)
    section = {"TrainingConfig": "training", "ParallelismConfig": "parallelism", "CompileConfig": "compile"}
    if name in section:
        data.setdefault(section[name], {}).update(_literal_keywords(call))
    elif name.endswith("set_rotate_method") and call.args and isinstance(call.args[0], ast.Constant):
        data["rotate_method"] = call.args[0].value
    elif name == "Float8LinearConverter.Config":
        recipe = _literal_keywords(call).get("recipe_name", "rowwise")
        data["float8"] = True
        data["quantize"] = {"linear": {"float8": {"recipe_name": recipe}}}
    for keyword in call.keywords:
        if keyword.arg == "activation_checkpoint":
            data["activation_checkpoint"] = _ac(keyword.value)


def _read_assign(node: ast.Assign, data: dict[str, Any]) -> None:
    target = ast.unparse(node.targets[0]).split(".")
    if len(target) == 2 and target[1] == "activation_checkpoint":
        data["activation_checkpoint"] = _ac(node.value)
    elif len(target) == 2 and target[1] == "compile" and isinstance(node.value, ast.Call):
        data["compile"] = _literal_keywords(node.value)
    elif len(target) == 3 and target[1] in ("training", "parallelism", "compile"):
        try:
            data.setdefault(target[1], {})[target[2]] = ast.literal_eval(node.value)
        except ValueError:
            pass  # an expression computed at run time: torchtitan's value is not known here


def _literal_keywords(call: ast.Call) -> dict[str, Any]:
    out = {}
    for keyword in call.keywords:
        try:
            out[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            continue
    return out


def _ac(value: ast.expr) -> dict[str, str]:
    """0.3's AC policy class as 0.2's ``[activation_checkpoint]`` table."""
    text = ast.unparse(value)
    if text == "None":
        return {"mode": "none"}
    if text.startswith("FullAC"):
        return {"mode": "full"}
    return {"mode": "memory_budget"} if text.startswith("MemoryBudgetAC") else SELECTIVE


def check_module_path(path: Path) -> None:
    """torchtitan 0.3 imports its config as a Python module (``--module NAME``): the file must be
    ``NAME.py`` with NAME a Python identifier, or one sentence saying so."""
    if path.suffix != ".py" or not path.stem.isidentifier():
        raise ExportError(
            f"torchtitan 0.3 imports its config as a Python module, so '{path.name}' cannot be loaded; "
            f"name the file NAME.py with NAME a Python identifier (e.g. {FILENAME}), or pass --format toml."
        )


def launch_for_module(command: str, path: Path) -> str:
    """``command`` loading the config written at ``path``: its stem as ``--module`` and its folder on
    ``PYTHONPATH`` (ConfigManager imports the module by name: torchtitan/config/manager.py)."""
    folder = shlex.quote(str(path.resolve().parent))
    command = command.replace(f"--module {MODULE} ", f"--module {path.stem} ")
    return f"PYTHONPATH={folder}${{PYTHONPATH:+:$PYTHONPATH}} {command}"
