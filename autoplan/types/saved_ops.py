"""What selective recomputation keeps: one statement, read by the cost model and the executor.

Op-level selective activation checkpointing (torchtitan's op SAC, ``torch.utils.checkpoint``
with a policy) keeps the outputs of the ops below and re-runs every other op of a block in the
backward. The tracer records a block as nodes of a kind (autoplan/trace/classify.py); the
executor's policy sees the aten kernels those nodes run as. :data:`SAVED` lists, per node kind
the cost model keeps (``SAVED_KINDS``, autoplan/cost/blocks.py), every kernel that kind runs as,
so the policy (autoplan/execute/recompute.py ``SAVED_OPS``) is built from the same table:

- ``linear``: an ``nn.Linear`` or a matmul on a weight, ``mm``/``addmm`` (``aten.linear`` is
  composite and decomposes into them); FP8 linears (torchao) run ``_scaled_mm`` on GPUs and, when
  emulated, ``mm`` on the dequantised operands.
- ``matmul``: activation matmuls (``bmm``, ``baddbmm``, ``mm``) and Hugging Face's grouped expert
  GEMMs, which the tracer records as batched matmuls under its routing model (autoplan/trace/moe.py)
  and transformers runs as ``_grouped_mm`` (``_scaled_grouped_mm`` in FP8).
- ``attention``: every fused SDPA kernel (flash, memory-efficient, cuDNN, the CPU flash kernel,
  the out-of-tree backends' overridable one) and the raw flash/efficient kernels. The math
  backend is composite: it runs as ``bmm`` (kept) and softmax (re-run), as an unfused attention does.
- ``conv``: ``convolution``.

Everything else re-runs, and is priced so (layers.summarise: ``selective_recompute_s``): norms,
activations, softmax, masks, dropout, and FP8's scaling passes (amax, scale, cast: the forward
half of ``compute.fp8_cast_bytes``, re-run before each kept ``_scaled_mm`` is looked up again).
"""

from __future__ import annotations

SAVED: dict[str, tuple[str, ...]] = {
    "linear": ("mm", "addmm", "_scaled_mm"),
    "matmul": ("mm", "bmm", "baddbmm", "_grouped_mm", "_scaled_grouped_mm"),
    "attention": (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ),
    "conv": ("convolution",),
}
#: node kinds whose outputs selective recomputation keeps (autoplan/cost/blocks.py)
SAVED_KINDS = tuple(SAVED)
#: the aten kernels (OpOverloadPacket names) the executor's policy saves
SAVED_ATEN_OPS = frozenset(name for names in SAVED.values() for name in names)
