"""Tensor-parallel plans for exec_models' models, module by module as a user writes ``tp_plan``: Megatron's
splits for TinyGPT and TinyLlama (and its relatives), with sequence parallelism on the norms when ``sp``."""

from __future__ import annotations

from exec_models import LAYERS


def gpt_tp_plan(sp: bool, *, attention: bool = True) -> dict[str, str]:
    """Megatron's splits; ``attention=False`` keeps c_attn/c_proj replicated (what the planner
    picks for a fused qkv), so under SP attention runs on an all-gathered sequence."""
    plan = {"wte": "rowwise", "lm_head": "colwise"}
    attn = ("colwise", "rowwise") if attention else ("replicate", "replicate")
    for i in range(LAYERS):
        plan.update(
            {
                f"h.{i}.attn.c_attn": attn[0],
                f"h.{i}.attn.c_proj": attn[1],
                f"h.{i}.c_fc": "colwise",
                f"h.{i}.c_proj": "rowwise",
            }
        )
        if sp:
            plan.update({f"h.{i}.ln_1": "sequence_parallel", f"h.{i}.ln_2": "sequence_parallel"})
    return plan


def lora_tp_plan(sp: bool) -> dict[str, str]:
    """LoRALlama's: Megatron's splits on the frozen base linears, their adapters replicated (as
    the planner names them: explicitly)."""
    plan = {}
    for module, split in llama_tp_plan(sp).items():
        if module.startswith("layers.") and split in ("colwise", "rowwise"):
            plan.update({f"{module}.base": split, f"{module}.a": "replicate", f"{module}.b": "replicate"})
        else:
            plan[module] = split
    return plan


def llama_tp_plan(sp: bool, *, embedding: str = "rowwise") -> dict[str, str]:
    plan = {"tok_embeddings": embedding, "output": "colwise"}
    for i in range(LAYERS):
        plan.update({f"layers.{i}.attention.{n}": "colwise" for n in ("wq", "wk", "wv")})
        plan.update(
            {
                f"layers.{i}.w1": "colwise",
                f"layers.{i}.w3": "colwise",
                f"layers.{i}.attention.wo": "rowwise",
                f"layers.{i}.w2": "rowwise",
            }
        )
        if sp:
            plan.update(
                {f"layers.{i}.attention_norm": "sequence_parallel", f"layers.{i}.ffn_norm": "sequence_parallel"}
            )
    if sp:
        plan["norm"] = "sequence_parallel"
    return plan
