"""Which plans can run a model whose embedding tables take sparse gradients (docs/executor.md,
"Sparse embedding gradients").

A table read with ``sparse=True`` (nn.Embedding, nn.EmbeddingBag, F.embedding; the trace's
``ParamInfo.sparse_grad``) gets a gradient that holds only the rows its batch read, as an
uncoalesced sparse COO tensor. PyTorch DDP all-reduces such a gradient as a sparse tensor (gloo
coalesces it, all-gathers indices and values and sums locally), and the executor makes the synced
gradient dense before AdamW. Nothing else runs it: FSDP2 and ZeRO-1 flatten gradients into dense
shards, DTensor (tp) and the pipeline's stage split have no sparse gradients, the explicit
all-reduce and the comm hooks (PowerSGD, top-k, a low-precision reduction) read a dense bucket.
The search offers, and the executor accepts, only plans that pass :func:`sparse_grad_refusal`.
"""

from __future__ import annotations

from typing import Any


def sparse_grad_blockers(plan: Any) -> list[str]:
    """What in ``plan`` cannot run a sparse embedding gradient (module docstring); empty when it can."""
    checks = (
        (plan.tp > 1, f"tp={plan.tp}"),
        (plan.pp > 1, f"pp={plan.pp}"),
        (plan.cp > 1, f"cp={plan.cp}"),
        (plan.zero_stage > 0, f"zero_stage={plan.zero_stage}"),
        (plan.dp > 1 and not plan.overlap_grad_reduce, "overlap_grad_reduce=false (the flat all-reduce)"),
        (plan.grad_compression != "none", f"grad_compression='{plan.grad_compression}'"),
        (plan.grad_reduce_dtype != "fp32", f"grad_reduce_dtype='{plan.grad_reduce_dtype}'"),
        (plan.offload != "none", f"offload='{plan.offload}'"),
    )
    return [text for blocked, text in checks if blocked]


def sparse_grad_refusal(plan: Any, tables: list[str]) -> str | None:
    """One sentence saying why ``plan`` cannot run a model with the sparse-gradient ``tables``, or None."""
    blockers = sparse_grad_blockers(plan)
    if not tables or not blockers:
        return None
    return (
        f"{', '.join(tables)} take sparse gradients (an embedding read with sparse=True), which only DDP syncs "
        f"(dp with zero_stage=0, tp=pp=cp=1, fp32 uncompressed reduction), but this plan has {', '.join(blockers)}: "
        "re-plan the model, or read the tables with sparse=False."
    )
