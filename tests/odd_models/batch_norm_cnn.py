"""Residual blocks of convolutions and batch norms, as ResNets and U-Nets write them. Under ZeRO-2/3 in bf16 FSDP2
casts a batch norm's weight and bias to bf16 and leaves its running statistics, buffers, in fp32: batch_norm refused
the mix at the first step (execute/precision.py ``NormParamsLikeStatistics``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

C = 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(C, C, 3, padding=1, bias=False), nn.BatchNorm2d(C)
        self.conv2, self.bn2 = nn.Conv2d(C, C, 3, padding=1, bias=False), nn.BatchNorm2d(C)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class BatchNormCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, C, 3, padding=1)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.norm, self.head = nn.BatchNorm1d(C), nn.Linear(C, 10)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x.mean((2, 3))))


def build_model():
    return BatchNormCNN()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 3, 8, 8),)


def example_target(batch_size):
    return torch.randint(0, 10, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
