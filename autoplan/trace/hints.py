"""What a refused trace tells the user to do, for the failures it can recognise (docs/trace.md, "Capture"): a
tensor made on the CPU beside the meta tensors, and a branch on tensor values."""

from __future__ import annotations

#: a forward() that makes a tensor without ``device=`` meets the meta tensors autoplan traces on
META_HINT = (
    "A tensor forward() makes without device= (torch.ones(S, S), torch.arange(S)) lands on the CPU while autoplan "
    "traces on the meta device: make it with device=x.device (as it must be for a GPU run too). "
)


def device_mismatch(message: str) -> bool:
    """Whether export met a CPU tensor beside the meta ones, in either order torch names them (LongT5's
    ``torch.ones(...)`` without a device read "found at least two devices, cpu and meta")."""
    return "meta and cpu" in message or "cpu and meta" in message


def data_dependent_hint(raised: str) -> str:
    """What code that needs tensor values (``raised``: where, capture.raised_in) is, and what to do."""
    return (
        f"needs tensor values that shape-only tracing does not have ({raised}: a Python branch on a tensor's "
        "values, such as nn.Transformer's check that a mask is causal, or data-dependent routing such as nonzero() "
        "or boolean-mask indexing). Pass what the branch checks as an argument (is_causal=True, "
        "tgt_is_causal=True); autoplan runs Mixture-of-Experts routing under its routing model when it recognises "
        "the layer: a router with one output per expert, a topk over them, and experts in Hugging Face's experts "
        "interface or an nn.ModuleList of alike modules (docs/moe.md); otherwise route with dense masks or a fixed "
        "capacity."
    )
