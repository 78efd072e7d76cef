"""Which models context parallelism can split (autoplan/types/context_parallel.py ``cp_refusal``), on
tiny models traced as the planner traces them: what the executor runs (autoplan/execute/
context_parallel.py: causal or unmasked SDPA over the whole sequence, inside the blocks) passes,
and each thing it cannot run is one sentence."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace import trace
from autoplan.types.context_parallel import cp_divides, cp_refusal, runnable_cp_variants

SEQ, DIM = 8, 16


class Block(nn.Module):
    def __init__(self, mask: str):
        super().__init__()
        self.qkv, self.mask = nn.Linear(DIM, 3 * DIM), mask

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.size(0), SEQ, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4).unbind(0)
        if self.mask == "explicit":
            causal = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.mask == "causal")
        return x + y.transpose(1, 2).reshape(x.shape)


class Model(nn.Module):
    def __init__(self, mask: str = "causal", attention_outside: bool = False):
        super().__init__()
        self.emb = nn.Embedding(32, DIM)
        self.layers = nn.ModuleList(Block(mask) for _ in range(2))
        self.attention_outside = attention_outside

    def forward(self, idx):
        x = self.emb(idx)
        if self.attention_outside:  # attention in the root forward, where no block shards it
            h = x.view(x.size(0), SEQ, 2, DIM // 2).transpose(1, 2)
            x = x + F.scaled_dot_product_attention(h, h, h, is_causal=True).transpose(1, 2).reshape(x.shape)
        for layer in self.layers:
            x = layer(x)
        return x


def _graph(model):
    return trace(model, (torch.randint(0, 32, (2, SEQ)),))


@pytest.mark.parametrize("mask", ["causal", "none"])
def test_causal_or_unmasked_attention_in_the_blocks_can_be_split(mask):
    assert cp_refusal(_graph(Model(mask))) is None


def test_an_explicit_mask_is_refused():
    said = cp_refusal(_graph(Model("explicit")))
    assert said is not None and "takes an explicit mask" in said and "is_causal=True" in said


def test_attention_outside_the_blocks_is_refused():
    said = cp_refusal(_graph(Model(attention_outside=True)))
    assert said is not None and "runs outside the model's blocks" in said and "plan cp=1" in said


def test_head_tail_chunks_need_2cp_to_divide_the_sequence():
    assert cp_divides(8, 2) and cp_divides(8, 4) and not cp_divides(8, 8) and not cp_divides(12, 4)


def test_gloo_runs_autoplans_allgather_and_ulysses_and_nccl_torchs_allgather_and_ring():
    assert runnable_cp_variants("gloo") == ("allgather", "ulysses")
    assert runnable_cp_variants("nccl") == ("allgather", "ring")


class RopeInside(nn.Module):
    """A block that builds its rotary positions from its own input's length, as much hand-written RoPE does."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)

    def forward(self, x):
        positions = torch.arange(x.shape[1], dtype=torch.float32, device=x.device)
        q, k, v = self.qkv(x).view(x.size(0), SEQ, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4).unbind(0)
        angle = positions[:, None] * torch.ones(DIM // 2, device=x.device)
        q, k = q * angle.cos(), k * angle.cos()
        return x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)


def test_positions_built_inside_a_block_refuse_context_parallelism():
    """Under cp a block sees its shard of the sequence, so ``torch.arange(x.shape[1])`` inside it counts from 0 on
    every rank: the run computed other gradients (--verify failed at 0.75). Positions built before the blocks
    (Model above, Hugging Face's models) are what the executor keeps global."""
    model = Model()
    model.layers = nn.ModuleList(RopeInside() for _ in range(2))
    graph = trace(model, (torch.zeros(2, SEQ, dtype=torch.long),))
    assert "builds positions of the whole sequence inside the block" in cp_refusal(graph)
    assert "layers.0" in cp_refusal(graph)
    assert cp_refusal(trace(Model(), (torch.zeros(2, SEQ, dtype=torch.long),))) is None
