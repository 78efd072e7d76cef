"""What every exporter and importer shares: the model facts a trainer's config needs beside the
plan, the exported file, and the config read back.

A framework's config carries the parallel layout *and* some model facts (Megatron-LM's
``--num-layers``, ``--hidden-size``; torchtitan's ``seq_len``). :class:`ModelFacts` holds those,
read from the traced graph (``graph.json`` of a plan folder) where it has them; a fact it lacks
is left out of the config with a comment saying which flag to set, never guessed.

:class:`Exported` is one file in the framework's own format. ``unexpressed`` lists, one sentence
each, what of the plan the framework cannot express (a per-op tensor-parallel split it has no
hook for, a schedule it lacks, a lossy option it has no switch for); each also appears as a
comment in ``text`` and as a warning on the CLI, so nothing is dropped silently.

:class:`Imported` is a config read back: the plan fields it sets (``Plan(**fields)`` with the
layout the framework would run: balanced stages and the default tensor-parallel split), what it
could not map, the facts it states about the model (compared with the traced model before pricing:
autoplan/export/pricing.py), and one sentence for each value that reading filled in because the
config does not state it (a framework default, ``--devices``/``--batch``, a DeepSpeed ``"auto"``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from autoplan.errors import ExportError
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.schedules import v_shaped

FRAMEWORKS = ("torchtitan", "megatron", "deepspeed", "accelerate")
__all__ = ["FRAMEWORKS", "ExportError", "Exported", "Imported", "ModelFacts"]


@dataclass(frozen=True)
class ModelFacts:
    """Model facts a trainer's config names; None where the trace does not say."""

    name: str = "model"
    layers: int | None = None  # repeated blocks
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    seq_len: int | None = None
    vocab_size: int | None = None
    block_class: str | None = None  # the repeated block's module class name (FSDP's wrap policy), when given
    ffn_hidden_size: int | None = None  # a dense block's MLP width (its widest Linear from the hidden size)
    params: int = 0  # the traced model's parameters, and how many of them are frozen (requires_grad=False)
    frozen_params: int = 0
    has_attention: bool | None = None  # a scaled-dot-product attention in the trace; None without a graph

    @classmethod
    def from_graph(cls, graph: Graph | None) -> "ModelFacts":
        if graph is None:
            return cls()
        attention = next((n.attrs for n in graph.nodes if n.op == "attention"), {})
        embedding = next((n.attrs for n in graph.nodes if n.op == "embedding"), {})
        return cls(
            name=graph.model_name,
            layers=len(graph.layers) or None,
            hidden_size=embedding.get("embedding_dim"),
            num_heads=attention.get("num_heads"),
            num_kv_heads=attention.get("num_kv_heads"),
            seq_len=graph.seq_len,
            vocab_size=embedding.get("num_embeddings"),
            ffn_hidden_size=_ffn_hidden_size(graph, embedding.get("embedding_dim")),
            params=graph.param_count,
            frozen_params=graph.param_count - graph.trainable_param_count,
            has_attention=bool(attention) or any(n.op == "attention" for n in graph.nodes),
        )


def _ffn_hidden_size(graph: Graph, hidden: int | None) -> int | None:
    """The widest Linear from the hidden size in the first block, outside attention: the MLP's up
    projection (SwiGLU's w1/w3, GPT's c_fc). None for an MoE model (its experts are not one MLP)."""
    if hidden is None or graph.moe_layers or not graph.layers:
        return None
    widths = [
        n.attrs["out_features"]
        for n in graph.layer_nodes(graph.layers[0])
        if n.op == "linear" and n.attrs.get("in_features") == hidden and "attention" not in n.attrs
    ]
    return max(widths, default=None)


@dataclass
class Exported:
    """One config file in a framework's own format (module docstring)."""

    framework: str
    filename: str  # the suggested file name, e.g. "torchtitan.toml"
    text: str
    unexpressed: list[str] = field(default_factory=list)
    launch: str = ""  # the framework's own launch command for this file

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "filename": self.filename,
            "unexpressed": list(self.unexpressed),
            "launch": self.launch,
        }


@dataclass
class Imported:
    """A framework config read back (module docstring)."""

    framework: str
    fields: dict[str, Any]  # Plan fields
    unmapped: list[str] = field(default_factory=list)  # settings autoplan does not price, one sentence each
    facts: ModelFacts = field(default_factory=ModelFacts)  # what the config states about the model; None: not stated
    assumptions: list[str] = field(default_factory=list)  # what reading filled in (a default, --batch, "auto")
    vocab_multiple: int = 1  # the framework pads the stated vocabulary to a multiple of this (Megatron-LM)

    def plan(self) -> Plan:
        return Plan(**self.fields)


def layers_per_stage(plan: Plan) -> int | None:
    """Blocks per pipeline chunk when the plan's stages are even, else None (a framework that only
    takes a count then cannot express the partition)."""
    if not plan.stages:
        return None
    sizes = {len(stage) for stage in plan.stages}
    return sizes.pop() if len(sizes) == 1 else None


def frozen_notes(facts: ModelFacts, framework: str) -> list[str]:
    """One sentence when the traced model has frozen parameters and ``framework`` trains its own
    model definition (torchtitan, Megatron-LM), which the config cannot make frozen; [] otherwise
    (docs/cost-model.md, "Frozen parameters")."""
    if not facts.frozen_params:
        return []
    return [
        f"{facts.frozen_params / facts.params:.1%} of the traced model's parameters are frozen (requires_grad=False) "
        f"and autoplan priced them so; {framework} trains its own model definition whole, so freeze them there "
        "(or expect full fine-tuning's memory, which this plan may not fit)."
    ]


def attention_notes(facts: ModelFacts, framework: str) -> list[str]:
    """One sentence when the trace shows no scaled-dot-product attention and ``framework`` trains its own
    transformer definition (Megatron-LM's GPT): its arguments then describe a transformer of the traced sizes, not
    this model (an LSTM or a CNN exported to Megatron said nothing, and Megatron's validate_args refused the file)."""
    if facts.has_attention is not False:
        return []
    return [
        f"the traced model calls no scaled_dot_product_attention (an LSTM, a CNN, or attention written as matmul and "
        f"softmax); {framework} trains its own transformer definition, so these arguments describe a transformer of "
        "the traced sizes, not this model, and its attention-head arguments are left for you to set."
    ]


def expert_layout_notes(plan: Plan, framework: str) -> list[str]:
    """The experts' own layout (types/expert_layout.py) where ``framework``'s config has no expert tensor
    parallelism nor experts folded over tp ranks: only Megatron-LM states it (export/megatron_moe.py); and the
    all-to-all overlap (:func:`a2a_overlap_notes`)."""
    if plan.expert_tp == 1 and not (plan.ep > 1 and plan.tp > 1):
        return a2a_overlap_notes(plan, framework)
    return [
        f"ep={plan.ep} x expert_tp={plan.expert_tp} beside tp={plan.tp}: {framework}'s config has no expert tensor "
        "parallelism (MoE Parallel Folding, priced as Megatron-Core runs it); export to Megatron-LM for this layout."
    ] + a2a_overlap_notes(plan, framework)


def a2a_overlap_notes(plan: Plan, framework: str) -> list[str]:
    """``moe_a2a_overlap`` where ``framework``'s config has no switch for it: only Megatron-LM's
    --overlap-moe-expert-parallel-comm runs it (export/megatron_moe.py)."""
    if not plan.moe_a2a_overlap:
        return []
    return [
        f"moe_a2a_overlap: {framework}'s config has no switch to run the EP all-to-all beside another micro-batch's "
        "compute, so it runs exposed there; export to Megatron-LM (--overlap-moe-expert-parallel-comm) for it."
    ]


def split_note(plan: Plan) -> str | None:
    """One sentence when the plan's tensor-parallel splits differ from the Megatron default a
    framework applies (autoplan/cost/tp/default.py), else None."""
    if plan.tp == 1 or not plan.tp_plan:
        return None
    return (
        f"autoplan's tensor-parallel plan splits {sum(1 for s in plan.tp_plan.values() if s != 'replicate')} "
        "modules by its own per-op choice; this framework applies its own fixed split (Megatron-style "
        "column/row pairs), so the priced split may differ from the one it runs."
    )


def comment_lines(framework: str, *, notes: list[str], remarks: list[str]) -> list[str]:
    """``#`` lines for a config file: what ``framework`` cannot express (``notes``) and what the
    user sets by hand (``remarks``), each item wrapped at 100 characters."""
    lines: list[str] = []
    if notes:
        lines += ["#", f"# {framework} cannot express these parts of the plan (autoplan priced them as planned):"]
        lines += _comment_block(notes)
    if remarks:
        lines += ["#", "# set by hand:"]
        lines += _comment_block(remarks)
    return lines


def _comment_block(items: list[str]) -> list[str]:
    out = []
    for item in items:
        wrapped = textwrap.wrap(item, width=100, break_on_hyphens=False)
        out += [f"# - {wrapped[0]}"] + [f"#   {w}" for w in wrapped[1:]]
    return out


def refuse_schedule_steps(plan: Plan, *, framework: str) -> None:
    """One sentence refusing ``schedule_steps`` k > 1 (types/schedule_steps.py) for a ``framework`` whose pipeline
    runs every micro-batch of a step in one schedule (Megatron-Core's ``--global-batch-size`` over
    ``--micro-batch-size`` x dp, DeepSpeed's ``gradient_accumulation_steps``): it has no accumulation outside it."""
    if plan.schedule_steps > 1:
        raise ExportError(
            f"schedule_steps={plan.schedule_steps}: {framework} runs all {plan.num_microbatches} micro-batches of a "
            "step in one pipeline schedule and has no gradient accumulation outside it; export a plan with "
            "schedule_steps=1 for it."
        )


def refuse_v_schedule(plan: Plan, *, framework: str, runs: str) -> None:
    """One sentence refusing a V schedule (zbv, dualpipev: types/layout.py) for a ``framework`` that places its
    pipeline chunks otherwise (``runs``: what it runs instead): the stage lists would run on other ranks."""
    if v_shaped(plan.schedule):
        raise ExportError(
            f"schedule={plan.schedule}: {framework} {runs} and cannot place two chunks per rank in a V; export a "
            "plan pinned to --fix schedule=interleaved_1f1b or 1f1b for it."
        )
