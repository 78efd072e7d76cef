"""What context parallelism sends: the one statement the step time, the search's bounds and the audit read
(docs/cost-model.md, "Context parallelism").

Per attention call, micro-batch and cp rank, with K the bytes of one whole-sequence key tensor on the
rank (B Hkv S D E: micro-batch B, Hkv key/value heads of the rank's tp shard, S the whole sequence,
D the head dim, E the compute dtype's bytes), Q = B H S D E the query's, and n = cp:

    variant    forward                                   backward
    allgather  1 all_gather of stack(K, V): 2K            1 reduce_scatter of (dK, dV): 2K
    ring       n-1 sends + n-1 recvs of a K,V shard 2K/n  n-1 of K,V 2K/n, n of dK,dV 2K/n * 4/E (fp32)
    ulysses    all_to_all of q Q/n, k K/n, v K/n, o Q/n  all_to_all of dO Q/n, dQ Q/n, dK K/n, dV K/n

Sources: Llama 3 (Dubey et al. 2024) section 3.3.2 and Transformer Engine's
``AttnFuncWithCPAndKVAllGather`` (all-gather K,V forward, reduce-scatter their gradients backward);
torch's ``_templated_ring_attention(_backward)`` (torch/distributed/tensor/experimental/_context_parallel/
_attention.py: n-1 K,V rotations forward and backward, n dK,dV rotations accumulated in fp32) and Liu et
al. 2023 (Ring Attention); DeepSpeed-Ulysses (Jacobs et al. 2023, section 3: four all-to-alls forward,
four backward, heads divisible by n). Bytes follow cost/network/comm.py: an all-gather's gathered output,
a reduce-scatter's input, an all-to-all's input, a send's tensor. ``overlap`` is the share of the same
pass's attention compute one message runs beside: a ring step's K,V travel while the previous shard's
attention block computes (1/n of the attention); Llama 3 leaves the all-gather exposed and Ulysses'
all-to-alls sit on the critical path (0).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.roofline import PRECISION_BYTES, activation_scale
from autoplan.types.graph import OpNode

FORWARD, BACKWARD = "forward", "backward"
#: bytes of an element of the gradients a ring accumulates and passes (torch's ``convert_to_f32``)
RING_GRAD_BYTES = 4


@dataclass(frozen=True)
class CpMessage:
    """One kind of message of one attention call, per micro-batch and cp rank (module docstring)."""

    kind: str  # all_gather | reduce_scatter | send_recv | all_to_all (cost/network/comm.py)
    message_bytes: float
    count: int  # how many of them per attention call (a send_recv counts one send and one recv)
    phase: str  # FORWARD or BACKWARD
    overlap: float = 0.0  # share of the pass's attention compute each one runs beside

    def audit_kinds(self) -> tuple[str, ...]:
        """The collective kinds the audit records for one message: a ring step sends one and receives one."""
        return ("send", "recv") if self.kind == "send_recv" else (self.kind,)


@dataclass(frozen=True)
class AttentionBytes:
    """One attention call's tensors on one cp rank, per micro-batch, whole sequence (module docstring)."""

    key_bytes: float  # K (V is the same)
    query_bytes: float  # Q (and the output O)
    element_bytes: float  # E


def attention_bytes(
    node: OpNode, *, precision: str, micro_batch_fraction: float, shard: int, dtypes: RunDtypes | None = None
) -> AttentionBytes:
    """K and Q of ``node`` for one micro-batch (``micro_batch_fraction`` of the traced batch) over the
    whole sequence, on a rank holding 1/``shard`` of the heads; the traced output is [B, H, S, D]. K and
    V are sent in the dtype attention is called with (``dtypes``: its key input's run dtype, fp32 where
    an fp32 rotary table promoted it under autocast; compute/dtypes.py), else in ``precision``."""
    heads = node.attrs.get("num_heads") or 1
    kv_heads = node.attrs.get("num_kv_heads_at_call") or node.attrs.get("num_kv_heads") or heads  # as SDPA gets them
    scale = activation_scale(node, precision=precision, dtypes=dtypes)
    query = node.output_bytes * scale * micro_batch_fraction / shard
    element = PRECISION_BYTES[precision] if dtypes is None else dtypes.operand_bytes(node, 1)
    key = query * kv_heads / heads * element / (PRECISION_BYTES[precision] if dtypes is None else dtypes.bytes(node))
    return AttentionBytes(key_bytes=key, query_bytes=query, element_bytes=element)


def attention_messages(variant: str, *, cp: int, tensors: AttentionBytes) -> tuple[CpMessage, ...]:
    """Every message of one attention call under ``variant`` at degree ``cp`` (module docstring's table)."""
    if cp == 1:
        return ()
    k, q = tensors.key_bytes, tensors.query_bytes
    if variant == "allgather":
        return (CpMessage("all_gather", 2 * k, 1, FORWARD), CpMessage("reduce_scatter", 2 * k, 1, BACKWARD))
    if variant == "ring":
        shard, step = 2 * k / cp, 1.0 / cp
        grads = shard * RING_GRAD_BYTES / tensors.element_bytes
        return (
            CpMessage("send_recv", shard, cp - 1, FORWARD, step),
            CpMessage("send_recv", shard, cp - 1, BACKWARD, step),
            CpMessage("send_recv", grads, cp, BACKWARD, step),
        )
    if variant == "ulysses":
        return tuple(
            CpMessage("all_to_all", size / cp, 1, phase)
            for phase in (FORWARD, BACKWARD)
            for size in (q, k, k, q)  # q, k, v then o; dO then dQ, dK, dV
        )
    raise ValueError(f"cp_variant '{variant}' is unknown; expected allgather, ring or ulysses.")


def forward(messages: tuple[CpMessage, ...]) -> tuple[CpMessage, ...]:
    """The forward's messages: those a recomputed forward sends again."""
    return tuple(m for m in messages if m.phase == FORWARD)


def gathered_kv_bytes(variant: str, *, cp: int, tensors: AttentionBytes) -> float:
    """Bytes an attention call holds for its backward beyond its local K,V shards: under allgather the
    gathered K and V (2K) replace the local shards (2K/cp); ring keeps its shards and re-rotates them,
    and Ulysses' head-sharded K,V are as large as the local ones."""
    if cp == 1 or variant != "allgather":
        return 0.0
    return 2 * tensors.key_bytes * (1 - 1 / cp)


def ulysses_refusal(node: OpNode, *, cp: int, shard: int) -> str | None:
    """None when Ulysses can split ``node``'s heads over ``cp`` on a rank holding 1/``shard`` of them
    (tensor parallelism's split), else one sentence saying why not."""
    heads = node.attrs.get("num_heads") or 1
    kv_heads = node.attrs.get("num_kv_heads_at_call") or node.attrs.get("num_kv_heads") or heads  # as SDPA gets them
    for name, count in (("heads", heads), ("key/value heads", kv_heads)):
        if count % shard or (count // shard) % cp:
            return (
                f"Ulysses context parallelism splits attention heads over cp={cp}, and '{node.name}' has {count} "
                f"{name} ({count // shard} per tp rank); use a cp that divides them, or cp_variant=allgather."
            )
    return None
