"""Convolutions on activations laid out channels-last, as ConvNeXt's blocks make them (a Linear on the permuted
channels, permuted back): the 2x2 convolution's weight gradient comes out channels-last. A split backward (the
zero-bubble schedules' W) hands that gradient to the weight as it is, where AdamW's fused kernel pairs weight and
gradient elements by memory order (docs/executor.md, "Gradients laid out as their parameters")."""

import torch
import torch.nn as nn
import torch.nn.functional as F

C = 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(C, C)
        self.conv = nn.Conv2d(C, C, 2, padding=1)  # 1x1 would hide it: its channels-last gradient is contiguous

    def forward(self, x):
        h = self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.conv(h)[..., 1:, 1:]


class ConvLayout(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(C, 10)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


def build_model():
    return ConvLayout()


def example_inputs(batch_size):
    return (torch.randn(batch_size, C, 8, 8),)


def example_target(batch_size):
    return torch.randint(0, 10, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
