"""A small DenseNet (Huang et al. 2017): dense blocks whose layers see every earlier feature map
(BatchNorm -> ReLU -> Conv, concatenated), joined by transitions that halve the resolution."""

import torch
import torch.nn as nn
import torch.nn.functional as F

GROWTH, CLASSES, SIDE = 8, 10, 16


class DenseLayer(nn.Module):
    def __init__(self, channels_in):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels_in)
        self.conv = nn.Conv2d(channels_in, GROWTH, 3, padding=1, bias=False)

    def forward(self, x):
        return torch.cat([x, self.conv(F.relu(self.norm(x)))], dim=1)


class DenseBlock(nn.Sequential):
    def __init__(self, channels_in, layers):
        super().__init__(*[DenseLayer(channels_in + i * GROWTH) for i in range(layers)])


class Transition(nn.Sequential):
    def __init__(self, channels_in, channels_out):
        super().__init__(
            nn.BatchNorm2d(channels_in), nn.ReLU(), nn.Conv2d(channels_in, channels_out, 1, bias=False), nn.AvgPool2d(2)
        )


class DenseNet(nn.Module):
    def __init__(self, layers_per_block=(2, 2)):
        super().__init__()
        channels = 2 * GROWTH
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        stages = []
        for i, layers in enumerate(layers_per_block):
            stages.append(DenseBlock(channels, layers))
            channels += layers * GROWTH
            if i < len(layers_per_block) - 1:
                stages.append(Transition(channels, channels // 2))
                channels //= 2
        self.features = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(channels)
        self.classifier = nn.Linear(channels, CLASSES)

    def forward(self, images):
        x = F.relu(self.norm(self.features(self.stem(images))))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model():
    return DenseNet()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 3, SIDE, SIDE),)


def example_target(batch_size):
    return torch.randint(0, CLASSES, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
