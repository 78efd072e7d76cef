"""A Vision Transformer (ViT-style): conv patch embedding, class token, learned positions,
pre-norm encoder blocks with SDPA (not causal), classification head. Sizes overridable with
AUTOPLAN_VIT_<NAME> for LAYERS, DIM, HEADS, IMAGE, PATCH, CLASSES."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS = int(os.environ.get("AUTOPLAN_VIT_LAYERS", 4))
DIM = int(os.environ.get("AUTOPLAN_VIT_DIM", 256))
HEADS = int(os.environ.get("AUTOPLAN_VIT_HEADS", 8))
IMAGE = int(os.environ.get("AUTOPLAN_VIT_IMAGE", 64))
PATCH = int(os.environ.get("AUTOPLAN_VIT_PATCH", 8))
CLASSES = int(os.environ.get("AUTOPLAN_VIT_CLASSES", 100))


class EncoderBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(B, N, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, PATCH, PATCH)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.zeros(1, (IMAGE // PATCH) ** 2 + 1, DIM))
        self.blocks = nn.ModuleList([EncoderBlock() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def build_model():
    return ViT()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 3, IMAGE, IMAGE),)


def example_target(batch_size):
    return torch.randint(0, CLASSES, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
