"""Top-k gradient sparsification with error feedback as a DDP communication hook (Lin et al., ICLR 2018,
"Deep Gradient Compression", Algorithm 1 without momentum correction, clipping or warm-up; docs/executor.md,
"Top-k sparsification"). Per bucket of fp32 gradients ``g`` on each of the p ranks, with residual ``e``:

    fed = e += g;  idx = top-k |fed|, k = sum_t ceil(r n_t) over the bucket's tensors;  vals = fed[idx]
    e[idx] = 0                                 (the residual keeps what was not sent)
    all-gather (int32 idx, fp32 vals) from every rank, one message of p k pairs
    g := (sum of every rank's pairs, scattered into zeros) / p

At r = 1 every entry is sent, the residual stays 0 and ``g`` is the exact mean. The hook finishes its
all-gather before it returns (as PowerSGD's under gloo, data_parallel.bucket_at_a_time). The residual is
kept per parameter too (``residual_of``) so that --verify can check error feedback's conservation and DDP's
rebuilt buckets (after the first step) find each parameter's residual again. The pricing is
autoplan/cost/dp/topk.py's.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

INDEX_DTYPE = torch.int32  # cost/dp/topk.py INDEX_BYTES


class TopKState:
    """The hook's state: its group, the ratio and each bucket's residual with its parameters."""

    def __init__(self, *, group: dist.ProcessGroup, ratio: float):
        self.group, self.ratio = group, ratio
        self._buckets: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}  # index -> (param ids, residual)
        self._views: dict[int, torch.Tensor] = {}  # id(param) -> its slice of a bucket's residual

    def selected(self, bucket: dist.GradBucket) -> int:
        """k of this bucket: sum over its tensors of ceil(r n) (cost/dp/topk.py selected_of)."""
        return sum(min(g.numel(), math.ceil(self.ratio * g.numel())) for g in bucket.gradients())

    def residual(self, bucket: dist.GradBucket) -> torch.Tensor:
        """The bucket's flat fp32 residual, rebuilt from its parameters' slices when DDP regrouped them."""
        params = bucket.parameters()
        ids = tuple(id(p) for p in params)
        found = self._buckets.get(bucket.index())
        if found is not None and found[0] == ids:
            return found[1]
        buffer = bucket.buffer()
        flat = torch.zeros(buffer.numel(), dtype=torch.float32, device=buffer.device)
        offset = 0
        for param, grad in zip(params, bucket.gradients()):
            old = self._views.get(id(param))
            view = flat[offset : offset + grad.numel()]
            if old is not None:
                view.copy_(old.reshape(-1))
            self._views[id(param)] = view.view(grad.shape)
            offset += grad.numel()
        self._buckets[bucket.index()] = (ids, flat)
        return flat

    def residual_of(self, param: nn.Parameter) -> torch.Tensor | None:
        """This rank's residual of ``param`` (None before its first compressed step)."""
        return self._views.get(id(param))

    def restore(self, param: nn.Parameter, residual: torch.Tensor) -> None:
        """Take ``param``'s residual from a checkpoint (execute/checkpoint/residual.py): the buckets are
        rebuilt from the parameters' residuals at their next step."""
        self._views[id(param)] = residual.to(torch.float32).reshape(param.shape)
        self._buckets.clear()

    def held_tensors(self) -> list[torch.Tensor]:
        """The residuals the hook keeps between steps (the audit's held bytes)."""
        return [flat for _, flat in self._buckets.values()]


def topk_hook(state, bucket):
    """The module docstring's step for one bucket; the bucket's buffer holds the averaged result. DDP
    checks a hook's annotations by identity, which postponed annotations break, hence none here."""
    buffer = bucket.buffer()
    assert buffer.dtype == torch.float32 and buffer.numel() < 2**31, "the Plan allows top-k over fp32 buckets"
    fed = state.residual(bucket).add_(buffer)
    k = state.selected(bucket)
    index = fed.abs().topk(k, sorted=False).indices
    values = fed[index]
    fed[index] = 0.0
    pairs = torch.cat([index.to(INDEX_DTYPE).view(torch.float32), values])  # bits of the index, not a value
    ranks = dist.get_world_size(state.group)
    gathered = torch.empty(ranks * 2 * k, dtype=torch.float32, device=buffer.device)
    dist.all_gather_single(gathered, pairs, group=state.group)
    gathered = gathered.view(ranks, 2, k)
    every_index = gathered[:, 0].contiguous().view(INDEX_DTYPE).reshape(-1).long()
    buffer.zero_().index_add_(0, every_index, gathered[:, 1].reshape(-1)).div_(ranks)
    done = torch.futures.Future()
    done.set_result(buffer)
    return done
