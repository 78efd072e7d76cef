"""A global filter network (GFNet's token mixing): each block multiplies the tokens' spectrum by a learned complex
filter. torch's fused AdamW takes floating parameters only and fully_shard one dtype per group: every plan stopped at
its first step ("`fused=True` requires all the params to be floating point", "FSDP expects uniform original parameter
dtype"); the complex filter now gets the unfused AdamW and is left out of fully_shard's groups, replicated."""

import torch
import torch.nn as nn
import torch.nn.functional as F

S, D = 16, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.filter = nn.Parameter(torch.randn(S // 2 + 1, D, dtype=torch.cfloat) * 0.02)
        self.mlp = nn.Linear(D, D)

    def forward(self, x):
        x = x + torch.fft.irfft(torch.fft.rfft(x, dim=1) * self.filter, n=S, dim=1)
        return x + torch.tanh(self.mlp(x))


class GlobalFilter(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def build_model():
    return GlobalFilter()


def example_inputs(batch_size):
    return (torch.randn(batch_size, S, D, generator=torch.Generator().manual_seed(0)),)


def example_target(batch_size):
    return torch.randint(0, 4, (batch_size,), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
