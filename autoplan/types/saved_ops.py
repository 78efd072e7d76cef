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

It also keeps the functional all-to-all's output (:data:`SAVED_COLLECTIVES`, as torchtitan's op SAC):
a recomputed MoE block never re-sends the expert dispatch's counts, rows or outputs, as DeepSeek-V3
(arXiv 2412.19437 section 3.2.3) re-runs no communication (cost/moe/experts.py ``reruns_a2a``).
Everything else re-runs and is priced so: norms, activations, softmax, masks, dropout, FP8's scaling.
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
#: collectives whose outputs selective recomputation keeps (module docstring): ``_c10d_functional.all_to_all_single``,
#: which ``all_to_all_single`` and ``all_to_all_single_autograd`` run; c10d's in-place ``alltoall_base_`` re-runs
SAVED_COLLECTIVES = ("all_to_all_single",)
#: the aten kernels (OpOverloadPacket names) the executor's policy saves
SAVED_ATEN_OPS = frozenset(name for names in SAVED.values() for name in names) | frozenset(SAVED_COLLECTIVES)
