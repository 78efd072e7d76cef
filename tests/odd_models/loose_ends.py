"""A pipeline's loose ends: forward({"x": x}, None, 2.0) takes a dict of tensors, a None and a Python float, a skip
connection joins the stem's output to the last block's by torch.cat (its gradient, a slice of the cat's, goes back
across the stage boundary), it returns (logits, None) as Hugging Face models return tuples with a None, and its
blocks drop out (p = 0.1), which a recomputed block re-runs inside the backward, and drop their path (stochastic
depth at 0.1, as Hugging Face's and timm's ``DropPath`` draw it with ``torch.rand``: --verify turns it off)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D = 16


class DropPath(nn.Module):
    """Each sample's residual branch dropped at ``drop_prob`` in training, the rest scaled up."""

    def __init__(self, drop_prob: float):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = (keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device)).floor()
        return x / keep * mask


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc, self.drop = nn.LayerNorm(D), nn.Linear(D, D), nn.Dropout(0.1)
        self.drop_path = DropPath(0.1)

    def forward(self, h):
        return h + self.drop_path(self.drop(torch.tanh(self.fc(self.norm(h)))))


class LooseEnds(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(6, D)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(2 * D, 3)

    def forward(self, batch, mask=None, temperature=1.0):
        skip = h = self.stem(batch["x"])
        for block in self.blocks:
            h = block(h)
        return self.head(torch.cat([h, skip], dim=-1)) / temperature, mask


def build_model():
    return LooseEnds()


def example_inputs(batch_size):
    return ({"x": torch.randn(batch_size, 6)}, None, 2.0)


def example_target(batch_size):
    return torch.randint(0, 3, (batch_size,))


def loss_fn(output, target):
    logits, _ = output
    return F.cross_entropy(logits, target)
