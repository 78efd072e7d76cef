"""A model that is one nn.Linear: no child module at all, so no block and no split point."""

import torch
import torch.nn as nn


def build_model():
    return nn.Linear(24, 6)


def example_inputs(batch_size):
    return (torch.randn(batch_size, 24),)
