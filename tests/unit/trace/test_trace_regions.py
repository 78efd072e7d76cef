"""A forward's no-grad and autocast regions trace (trace/capture.py ``_without_region_checks``): torch.export keeps
each as a higher-order op with a body of its own, and a ``.to()`` inside one wrote a device check for the meta
tensors it exported on, which failed when the trace ran the body on CPU fake tensors."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace import trace

D, S, V = 16, 8, 32


class Rotary(nn.Module):
    """Hugging Face's shape: cos and sin in fp32 under no_grad and autocast off, cast back with ``.to``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)), persistent=False)

    @torch.no_grad()
    def forward(self, x, positions):
        inv = self.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)  # .float() of a float: checked
        with torch.autocast(device_type="cpu", enabled=False):
            freqs = (inv @ positions[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary, self.mix = Rotary(), nn.Linear(D, 2 * D)

    def forward(self, x):
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        cos, sin = self.rotary(x, positions)
        a, b = self.mix(x * cos + x.flip(-1) * sin).chunk(2, dim=-1)  # torch.fx cannot unpack: torch.export traces
        return x + F.gelu(a) * b


class RotaryModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_no_grad_rotary_with_a_cast_in_every_block_traces():
    with torch.device("meta"):
        model, ids = RotaryModel(), torch.randint(0, V, (4, S))
    graph = trace(model, (ids,))
    assert graph.layers == ["blocks.0", "blocks.1", "blocks.2"]
    assert sum(n.fwd_flops for n in graph.nodes if n.module.startswith("blocks.2")) > 0  # the stitched block priced


class Positions(nn.Module):
    """HF M2M100's shape: positions from the ids under ``@torch.no_grad()``, moved ``.to(ids.device)``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(S + 2, D), persistent=False)

    @torch.no_grad()
    def forward(self, ids):
        positions = (torch.cumsum(ids.ne(0).int(), dim=1) * ids.ne(0).int()).long().to(ids.device)
        return self.table.index_select(0, positions.view(-1)).view(*ids.shape, D)


class PositionsModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.positions = nn.Embedding(V, D), Positions()
        self.blocks = nn.ModuleList(nn.Linear(D, D) for _ in range(2))
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        x = self.embed(ids) + self.positions(ids)
        if x.shape[1] > 1:  # a branch torch.fx cannot take: torch.export traces
            for block in self.blocks:
                x = x + torch.tanh(block(x))
        return self.head(x)


def test_a_no_grad_region_moving_a_tensor_to_the_input_device_traces():
    """torch.export baked ``.to(ids.device)`` as the meta device it ran on, inside the region's body; the trace ran
    that body on CPU fakes ("found at least two devices, cpu and meta")."""
    with torch.device("meta"):
        model, ids = PositionsModel(), torch.randint(0, V, (4, S))
    graph = trace(model, (ids,))
    assert graph.layers == ["blocks.0", "blocks.1"]
    assert any(n.module == "positions" for n in graph.nodes)
