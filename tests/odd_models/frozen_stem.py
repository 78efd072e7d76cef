"""A frozen stem (requires_grad=False, as a fine-tune freezes a pretrained backbone): a two-stage pipeline puts its
frozen blocks alone on the first stage, whose rank then holds no parameter to train."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D = 16


class FrozenStem(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.GELU()) for _ in range(4))
        for block in self.blocks[:2]:
            block.requires_grad_(False)
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return FrozenStem()


def example_inputs(batch_size):
    return (torch.randn(batch_size, D),)


def example_target(batch_size):
    return torch.randint(0, 3, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
