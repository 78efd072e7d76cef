"""Causal or full attention over a sequence sharded head-tail across the cp group (docs/executor.md,
"Context parallelism"): rank r holds chunks r and 2cp-1-r of 2cp chunks (``c = S / 2cp`` tokens
each) of q, k and v, shaped ``[B, H, 2c, D]``: torch's ``_HeadTailLoadBalancer`` order.

**autoplan's CPU path** (gloo; all-gather KV, Llama 3 section 3.3). Per call and rank, with ``E`` bytes
per element and ``Hkv`` KV heads on this rank:

    forward:  one all_gather of stack(k, v)       output 2 B Hkv S D E bytes
    backward: one reduce_scatter of stack(dK, dV)  input  2 B Hkv S D E bytes   (dq needs nothing)

The gathered K, V are put in global order; the head chunk (global index j = r) and the tail chunk
(j = 2cp-1-r) each attend to keys 0 .. (j+1)c-1 under a causal mask aligned to its last key
(query i sees keys <= j c + i): two SDPA calls of equal total work on every rank. Without a causal
mask both chunks attend to all S keys in one call, under a mask made before the blocks (``[B, H, S, S]``,
Hugging Face's) its rows of the two chunks. GQA goes through SDPA's ``enable_gqa``.

**Ulysses** (DeepSpeed-Ulysses, Jacobs et al. 2023 section 3; any backend): all-to-alls turn q, k and
v from sequence shards of all heads into the whole sequence of 1/cp of the heads, one causal (or
unmasked) SDPA runs on it, and an all-to-all turns the output back: four all-to-alls forward (q, k,
v, o), four backward (dO, dQ, dK, dV), each of the local tensor's bytes; heads divide by cp; a mask whole.

**CUDA** (NCCL): torch's context-parallel SDPA, as torchtitan runs it: q, k, v as DTensors sharded on
the sequence dim of the cp mesh, dispatched to torch's ring attention (rotate method "allgather"
or "alltoall") with its head-tail load balancing (autoplan/execute/context_parallel.py enables it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

#: the sequence dim of SDPA's [B, H, S, D] operands
SEQ_DIM = 2
# torch 2.13 names them *_single (the *_tensor names are deprecated aliases)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllGatherKV(torch.autograd.Function):
    """Forward: all-gather (k, v) over the cp group and order the chunks globally; backward:
    reduce-scatter (dK, dV) back to each rank's two chunks (module docstring)."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup):
        cp = dist.get_world_size(group)
        kv = torch.stack([k, v]).contiguous()  # [2, B, H, 2c, D]
        gathered = kv.new_empty((cp * 2, *kv.shape[1:]))  # gloo concatenates on dim 0
        _all_gather(gathered, kv, group=group)
        gathered = gathered.view(cp, *kv.shape)  # [cp, 2, B, H, 2c, D], rank-major
        c = k.size(SEQ_DIM) // 2
        heads, tails = gathered[..., :c, :], gathered[..., c:, :]  # chunk r and 2cp-1-r of rank r
        whole = torch.cat([*heads.unbind(0), *tails.flip(0).unbind(0)], dim=-2)  # [2, B, H, S, D]
        ctx.group, ctx.cp, ctx.c = group, cp, c
        return whole[0], whole[1]

    @staticmethod
    def backward(ctx, dk_whole: torch.Tensor, dv_whole: torch.Tensor):
        cp, c = ctx.cp, ctx.c
        chunks = torch.stack([dk_whole, dv_whole]).split(c, dim=-2)  # 2cp chunks in global order
        send = torch.cat([torch.cat([chunks[r], chunks[2 * cp - 1 - r]], dim=-2) for r in range(cp)])
        mine = send.new_empty((2, *send.shape[1:]))
        _reduce_scatter(mine, send.contiguous(), op=dist.ReduceOp.SUM, group=ctx.group)
        return mine[0], mine[1], None


def _aligned_causal_mask(rows: int, keys: int, device: torch.device) -> torch.Tensor:
    """Query i of ``rows`` queries whose last one sits at key ``keys - 1`` sees keys <= i + keys - rows."""
    return torch.ones(rows, keys, dtype=torch.bool, device=device).tril(keys - rows)


def mask_of_heads(mask: torch.Tensor, *, heads: int) -> torch.Tensor:
    """``mask`` for attention over ``heads`` heads: broadcast over heads, or one per head as many as there are.
    A per-head mask of the model's heads beside tensor parallelism's share of them is refused."""
    if mask.dim() < 3 or mask.size(-3) in (1, heads):
        return mask
    from autoplan.errors import PlanError

    raise PlanError(
        f"context parallelism applies a per-head mask of {mask.size(-3)} heads to attention over {heads} heads "
        "(tensor parallelism's share); plan tp=1 beside cp, or a mask shared by every head."
    )


def _rows_of(mask: torch.Tensor, *, cp: int, rank: int) -> torch.Tensor:
    """The rows of a whole-sequence mask ``[..., S or 1, S]`` for this rank's chunks r and 2cp-1-r."""
    if mask.size(-2) == 1:
        return mask
    c = mask.size(-2) // (2 * cp)
    head, tail = mask[..., rank * c : (rank + 1) * c, :], mask[..., (2 * cp - 1 - rank) * c : (2 * cp - rank) * c, :]
    return torch.cat([head, tail], dim=-2)


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup,
    is_causal: bool,
    dropout_p: float = 0.0,
    scale: float | None = None,
    enable_gqa: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """This rank's attention output ``[B, H, 2c, D]`` for its head-tail shards (module docstring)."""
    keys, values = _AllGatherKV.apply(k, v, group)
    sdpa = {"dropout_p": dropout_p, "scale": scale, "enable_gqa": enable_gqa}
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    if attn_mask is not None:
        rows = _rows_of(attn_mask, cp=cp, rank=rank)
        return _flash_layout(F.scaled_dot_product_attention(q, keys, values, attn_mask=rows, **sdpa))
    if not is_causal:
        return _flash_layout(F.scaled_dot_product_attention(q, keys, values, **sdpa))
    c = q.size(SEQ_DIM) // 2
    outputs = []
    for chunk, rows in ((rank, q[:, :, :c]), (2 * cp - 1 - rank, q[:, :, c:])):
        seen = (chunk + 1) * c
        mask = _aligned_causal_mask(c, seen, q.device)
        outputs.append(
            F.scaled_dot_product_attention(rows, keys[:, :, :seen], values[:, :, :seen], attn_mask=mask, **sdpa)
        )
    return _flash_layout(torch.cat(outputs, dim=SEQ_DIM))


def _flash_layout(out: torch.Tensor) -> torch.Tensor:
    """``out`` ([B, H, S, D]) laid out in memory as [B, S, H, D], as SDPA's flash kernels return it:
    a graph exported from the model (a pipeline stage) may ``view`` its transpose without a copy."""
    return out.transpose(1, 2).contiguous().transpose(1, 2)


def torch_cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cp_mesh: DeviceMesh,
    is_causal: bool,
    dropout_p: float = 0.0,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch's context-parallel SDPA on local shards (module docstring): the operands become
    DTensors sharded on the sequence of ``cp_mesh``, which torch's CP dispatcher runs as ring
    attention; the output comes back local. torchtitan's ``apply_cp_to_forward`` does the same."""
    placement = [Shard(SEQ_DIM)]
    q, k, v = (DTensor.from_local(t, cp_mesh, placement, run_check=False) for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )
    return out.to_local() if isinstance(out, DTensor) else out


def _seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[B, H, 2c, D] head-tail shards of every head -> [B, H/cp, S, D], the whole sequence in global
    order of this rank's 1/cp of the heads (one all-to-all)."""
    cp, (b, h, local, d) = dist.get_world_size(group), x.shape
    send = x.reshape(b, cp, h // cp, local, d).transpose(0, 1).contiguous()  # head group j goes to rank j
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)  # got[s]: rank s's chunks s and 2cp-1-s
    c = local // 2
    heads, tails = got[..., :c, :], got[..., c:, :]
    return torch.cat([*heads.unbind(0), *tails.flip(0).unbind(0)], dim=SEQ_DIM)


def _heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`: [B, H/cp, S, D] -> [B, H, 2c, D] (one all-to-all)."""
    cp, (b, h, seq, d) = dist.get_world_size(group), x.shape
    chunks = x.split(seq // (2 * cp), dim=SEQ_DIM)
    send = torch.stack([torch.cat([chunks[r], chunks[2 * cp - 1 - r]], dim=SEQ_DIM) for r in range(cp)])
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)  # got[j]: this rank's tokens of head group j
    return got.transpose(0, 1).reshape(b, cp * h, 2 * seq // (2 * cp), d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _heads_to_seq(grad.contiguous(), ctx.group), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup):
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _seq_to_heads(grad.contiguous(), ctx.group), None


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup,
    is_causal: bool,
    dropout_p: float = 0.0,
    scale: float | None = None,
    enable_gqa: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """This rank's attention output ``[B, H, 2c, D]`` for its head-tail shards, through 1/cp of the
    heads over the whole sequence (module docstring)."""
    whole = [_SeqToHeads.apply(t, group) for t in (q, k, v)]
    if attn_mask is not None and attn_mask.dim() >= 3 and attn_mask.size(-3) > 1:  # this rank's head group
        share = attn_mask.size(-3) // dist.get_world_size(group)
        attn_mask = attn_mask.narrow(-3, dist.get_rank(group) * share, share)
    out = F.scaled_dot_product_attention(
        *whole, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )
    return _flash_layout(_HeadsToSeq.apply(out, group))
