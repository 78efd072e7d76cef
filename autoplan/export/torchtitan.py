"""A plan as a torchtitan config, in the format of the torchtitan release it is for (docs/export-torchtitan.md).

========= ============================================================ ==============================
format    torchtitan                                                   module
========= ============================================================ ==============================
``py``    0.3 and later (the default): a Python config function that    autoplan/export/torchtitan_py.py
          ``torchtitan.train --module FILE --config autoplan_plan``
          loads, starting from the model's own recipe
``toml``  0.2.x: the ``JobConfig`` TOML of ``--job.config_file``       autoplan/export/torchtitan_toml.py
========= ============================================================ ==============================

What both share lives here: which flavour of torchtitan's registry the traced model is
(:mod:`autoplan.export.torchtitan_flavours`, read from the installed torchtitan), the explicit
module lists of the pipeline chunks, the plan's sentences torchtitan cannot express, and the
launch line. :func:`read` reads either format back (a ``.toml``, or a Python config function).
"""

from __future__ import annotations

from typing import Any

from autoplan.export.activation_offload import activation_offload_notes
from autoplan.export.common import Exported, ExportError, Imported, ModelFacts, expert_layout_notes, split_note
from autoplan.export.local_sgd import local_sgd_notes
from autoplan.export.torchtitan_flavours import Flavour, Registry, describe_shape, matching, read_registry
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import step_microbatches

FORMATS = {"py": "0.3", "toml": "0.2"}  # format -> the torchtitan release series it is written for
GPUS_PER_NODE = 8  # a plan does not say how its devices sit in nodes; the launch line assumes 8
#: torchtitan's schedules that run several stages per rank (lower-cased names)
MULTI_STAGE = ("interleaved1f1b", "loopedbfs", "interleavedzerobubble", "zbvzerobubble", "dualpipev")
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "interleaved_zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",  # torchtitan places its stages in the V (pipeline_parallel.py, style "v"), as autoplan
    "dualpipev": "DualPipeV",
}


def export(plan: Plan, facts: ModelFacts, *, fmt: str = "py", registry: Registry | None = None) -> Exported:
    """The plan in ``fmt`` (module docstring). ``registry`` is torchtitan's flavours (read from the
    installed torchtitan when not given)."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is not a torchtitan format; use py (torchtitan >= 0.3) or toml (0.2.x).")
    registry = registry if registry is not None else read_registry()
    if fmt == "toml":
        from autoplan.export import torchtitan_toml

        return torchtitan_toml.export(plan, facts, registry=registry)
    from autoplan.export import torchtitan_py

    return torchtitan_py.export(plan, facts, registry=registry)


def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """A torchtitan config read back into Plan fields: a 0.2 TOML or a 0.3 Python config function;
    ``batch_size`` (``--batch``) stands for a global batch the file leaves unset."""
    from autoplan.export import torchtitan_py, torchtitan_toml

    if torchtitan_py.looks_like_python(text):
        return torchtitan_py.read(text, devices=devices, batch_size=batch_size)
    return torchtitan_toml.read(text, devices=devices, batch_size=batch_size)


# ---- shared by both formats --------------------------------------------------------------------
def pick_flavour(registry: Registry, facts: ModelFacts, fmt: str) -> tuple[Flavour | None, str | None]:
    """The registry flavour the traced model is, or None and one sentence saying why and what to set.

    Variants that only change an implementation (``8B_flex`` beside ``8B``, ``llama3_ft`` beside
    ``llama3``: names that extend another match's) are dropped; a match must then be unique."""
    series = FORMATS[fmt]
    what = f"'{facts.name}' ({describe_shape(facts) or 'no sizes traced'})"
    if registry.reason:
        return None, f"the model flavour could not be matched: {registry.reason}; set the flavour of {what}."
    if not registry.version.startswith(series):
        return None, (
            f"the model flavour could not be matched: torchtitan {registry.version} is installed here, "
            f"not {series}.x; set the flavour of {what}."
        )
    found = _without_variants(matching(registry, facts))
    if len(found) == 1:
        return found[0], None
    if not found:
        return None, f"no flavour of torchtitan {registry.version}'s registry has the shape of {what}; set your model."
    names = ", ".join(f"{f.module} {f.flavor}" for f in found)
    return None, f"several torchtitan flavours have the shape of {what} ({names}); set the one to train."


def _without_variants(found: list[Flavour]) -> list[Flavour]:
    def extends(a: str, b: str) -> bool:
        return a != b and a.startswith(b + "_")

    def variant(f: Flavour) -> bool:
        same_module = any(f.module == g.module and extends(f.flavor, g.flavor) for g in found)
        return same_module or any(extends(f.module, g.module) and f.flavor == g.flavor for g in found)

    return [f for f in found if not variant(f)]


def training_batch(plan: Plan, facts: ModelFacts, remarks: list[str], *, seq_len_key: str) -> dict[str, Any]:
    """The training settings both config formats share: torchtitan's local and global batch, the
    traced sequence length (a remark names ``seq_len_key`` when the trace does not state it), and
    mixed precision (parameters in bf16 unless fp32, gradients reduced in fp32)."""
    # under pp one schedule step's micro-batches (schedule_steps k: torchtitan's global / (local x dp) accumulation)
    local = plan.micro_batch_size * step_microbatches(plan) if plan.pp > 1 else plan.micro_batch_size
    out: dict[str, Any] = {"local_batch_size": local, "global_batch_size": plan.global_batch_size}
    if facts.seq_len:
        out["seq_len"] = facts.seq_len
    else:
        remarks.append(f"{seq_len_key}: the trace does not state the sequence length; set it.")
    out["mixed_precision_param"] = "float32" if plan.precision == "fp32" else "bfloat16"
    out["mixed_precision_reduce"] = "float32"
    return out


def chunk_sizes(plan: Plan, facts: ModelFacts, notes: list[str]) -> list[int] | None:
    """Blocks per pipeline chunk, in order: the plan's stages, or an even split of the traced blocks;
    None when neither is known, and then a note says torchtitan balances the layers itself."""
    chunks = plan.pp * plan.virtual_stages
    if plan.stages:
        return [len(stage) for stage in plan.stages]
    if facts.layers and facts.layers % chunks == 0:
        return [facts.layers // chunks] * chunks
    notes.append(
        f"pipeline stages: the blocks of autoplan's {chunks} chunks are unknown; "
        "torchtitan splits the layers by its own balance."
    )
    return None


def chunk_modules(sizes: list[int], first: list[str], last: list[str]) -> list[list[str]]:
    """torchtitan's module names per chunk (``module_fqns_per_model_part``): ``first`` (the
    embedding) on chunk 0, blocks ``layers.i`` in order, ``last`` (norm and head) on the last chunk."""
    out, start = [], 0
    for index, size in enumerate(sizes):
        names = [f"layers.{i}" for i in range(start, start + size)]
        out.append((first if index == 0 else []) + names + (last if index == len(sizes) - 1 else []))
        start += size
    return out


def precision_notes(plan: Plan, *, series: str) -> list[str]:
    notes = []
    if plan.precision == "fp16":
        notes.append("fp16 training: torchtitan has no fp16 mixed precision; written as bf16.")
    if plan.grad_reduce_dtype != "fp32":
        notes.append(
            f"gradient reduction in {plan.grad_reduce_dtype}: torchtitan {series} reduces in float32 only "
            "(mixed_precision_reduce), so it sends twice the bytes autoplan priced."
        )
    return notes


def context_parallel(plan: Plan, facts: ModelFacts, notes: list[str], *, series: str) -> dict[str, Any]:
    """torchtitan's context-parallel settings: the degree and, with cp > 1, head-tail load balancing
    (as autoplan prices it). torchtitan runs one variant, allgather (0.3's language models attend with
    FlexAttention, whose cp all-gathers keys and values; 0.2.2 trains with torch's default all-gather
    rotation, its rotate key reaching only the validator): ring and Ulysses are notes. So are ZeRO-0/1
    (its FSDP mesh is dp_shard x cp: it shards whenever cp > 1, ParallelDims.fsdp_enabled) and a sequence
    its trainer refuses (seq_len divisible by 2cp, times tp with sequence parallelism: Trainer.__init__)."""
    if plan.cp == 1:
        return {"context_parallel_degree": 1}
    if plan.cp_variant != "allgather":
        runs = (
            "FlexAttention all-gathers keys and values" if series == "0.3" else "training all-gathers keys and values"
        )
        notes.append(
            f"cp={plan.cp} {plan.cp_variant}: torchtitan {series} has no {plan.cp_variant} context parallelism; "
            f"its {runs} (allgather), which moves other bytes than autoplan priced."
        )
    if plan.zero_stage < 2:
        notes.append(
            f"ZeRO-{plan.zero_stage} with cp={plan.cp}: torchtitan shards weights over dp_shard x cp whenever "
            "cp > 1; written as FSDP without resharding after forward (ZeRO-2-like), which shards gradients."
        )
    divisor = 2 * plan.cp * (plan.tp if plan.sequence_parallel else 1)
    if facts.seq_len and facts.seq_len % divisor:
        notes.append(
            f"seq_len {facts.seq_len} is not divisible by {divisor} (2 x cp, times tp with sequence parallelism): "
            "torchtitan's trainer refuses it at start-up."
        )
    return {"context_parallel_degree": plan.cp, "context_parallel_load_balancer": "headtail"}


def general_notes(plan: Plan) -> list[str]:
    notes = []
    if plan.grad_compression == "powersgd":
        notes.append(f"PowerSGD rank {plan.powersgd_rank}: torchtitan has no gradient compression.")
    if plan.grad_compression == "topk":
        notes.append(f"top-k sparsification ({plan.topk_ratio:g}): torchtitan has no gradient compression.")
    if not plan.overlap_grad_reduce and plan.dp > 1:
        notes.append("gradient reduction after the backward: torchtitan's FSDP and DDP always overlap it.")
    notes += activation_offload_notes(plan, "torchtitan")
    notes += local_sgd_notes(plan, "torchtitan")
    note = split_note(plan)
    if note:
        notes.append(note)
    return notes + expert_layout_notes(plan, "torchtitan 0.3")


def launch(devices: int, entry_args: str) -> str:
    """torchrun on the largest divisor of ``devices`` up to :data:`GPUS_PER_NODE` per node."""
    per_node = max(g for g in range(1, GPUS_PER_NODE + 1) if devices % g == 0)
    nodes = devices // per_node
    rdzv = " --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500" if nodes > 1 else ""
    return f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} -m torchtitan.train {entry_args}"


def nodes_note(devices: int) -> list[str]:
    if devices <= GPUS_PER_NODE:
        return []
    return [f"({GPUS_PER_NODE} GPUs per node assumed: --nnodes x --nproc-per-node must be {devices})"]


def pipeline_schedule(plan: Plan, notes: list[str]) -> str:
    """torchtitan's ``pipeline_parallel_schedule`` for the plan. torchtitan runs a multi-stage schedule
    (InterleavedZeroBubble) with at least 2 stages per rank, so ZB-H1 (``interleaved_zb`` at v = 1) is
    written as 1F1B, and said."""
    if plan.schedule == "interleaved_zb" and plan.virtual_stages == 1:
        notes.append(
            "ZB-H1 (schedule interleaved_zb, one stage per rank): torchtitan runs InterleavedZeroBubble with at "
            "least 2 stages per rank only; written as 1F1B, whose bubble is (pp-1)(F+B+W), not (pp-1)(F+B-W)."
        )
        return SCHEDULES["1f1b"]
    return SCHEDULES[plan.schedule]


def schedule_named(name: str, unmapped: list[str]) -> str:
    """The plan's schedule for torchtitan's ``pipeline_parallel_schedule`` ``name`` (any case); one autoplan has
    no term for reads as interleaved_1f1b (a multi-stage one) or 1f1b, said in ``unmapped``."""
    schedule = {v.lower(): k for k, v in SCHEDULES.items()}.get(name.lower())
    if schedule is None:
        schedule = "interleaved_1f1b" if name.lower() in MULTI_STAGE else "1f1b"
        unmapped.append(f"pipeline schedule {name}: autoplan has no term for it; read as {schedule}.")
    return schedule
