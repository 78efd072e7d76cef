"""A model built in bf16 (``.to(torch.bfloat16)``, as ``torch_dtype=torch.bfloat16`` builds a Hugging Face model): it
computes in bf16 whatever autocast says. Its plans read fp32, and --verify judged it by fp32's tolerance against a
reference stepping fp32 copies, where the run steps its bf16 parameters: every plan failed. The planner now plans it
in bf16 only (solve/space.py ``built_in_precision``) and the reference steps bf16 copies (execute/job/verify.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D = 32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU()) for _ in range(4))
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def build_model():
    return Net().to(torch.bfloat16)


def example_inputs(batch_size):
    return (torch.randn(batch_size, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16),)


def example_target(batch_size):
    return torch.randint(0, 4, (batch_size,), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.cross_entropy(output.float(), target)
