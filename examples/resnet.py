"""A ResNet-18-style image classifier (BasicBlocks in four stages layer1..layer4), 64x64
images, 100 classes. Sizes overridable with AUTOPLAN_RESNET_WIDTH / _IMAGE / _CLASSES / _BLOCKS."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH = int(os.environ.get("AUTOPLAN_RESNET_WIDTH", 32))
IMAGE = int(os.environ.get("AUTOPLAN_RESNET_IMAGE", 64))
CLASSES = int(os.environ.get("AUTOPLAN_RESNET_CLASSES", 100))
BLOCKS = [int(b) for b in os.environ.get("AUTOPLAN_RESNET_BLOCKS", "2,2,2,2").split(",")]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, WIDTH, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(WIDTH)
        cin = WIDTH
        for i, n in enumerate(BLOCKS):
            cout, stride = WIDTH * 2**i, 1 if i == 0 else 2
            blocks = [BasicBlock(cin if j == 0 else cout, cout, stride if j == 0 else 1) for j in range(n)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            cin = cout
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for i in range(len(BLOCKS)):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model():
    return ResNet()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 3, IMAGE, IMAGE),)


def example_target(batch_size):
    return torch.randint(0, CLASSES, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
