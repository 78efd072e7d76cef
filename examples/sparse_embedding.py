"""A recommender-style model whose embeddings take sparse gradients (issue 36 item 2): a token
table read through ``nn.Embedding(sparse=True)``, a category table through
``nn.EmbeddingBag(sparse=True)`` and an MLP on top. A step touches only the rows its batch reads,
so data parallelism all-reduces those rows (gloo's sparse all-reduce) instead of the whole table
(docs/cost-model.md, "Sparse embedding gradients"). Sizes: AUTOPLAN_SPARSE_VOCAB (rows of the
token table), AUTOPLAN_SPARSE_DIM, AUTOPLAN_SPARSE_SEQ (tokens per sample)."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = int(os.environ.get("AUTOPLAN_SPARSE_VOCAB", "4096"))
DIM = int(os.environ.get("AUTOPLAN_SPARSE_DIM", "32"))
SEQ = int(os.environ.get("AUTOPLAN_SPARSE_SEQ", "16"))
CATEGORIES, CLASSES = 256, 8


class SparseRecommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM, sparse=True)
        self.categories = nn.EmbeddingBag(CATEGORIES, DIM, mode="mean", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 4 * DIM), nn.ReLU(), nn.Linear(4 * DIM, CLASSES))

    def forward(self, tokens, categories):
        pooled = self.tokens(tokens).mean(dim=1)
        return self.mlp(torch.cat([pooled, self.categories(categories)], dim=-1))


def build_model():
    return SparseRecommender()


def example_inputs(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ)), torch.randint(0, CATEGORIES, (batch_size, 4))


def example_target(batch_size):
    return torch.randint(0, CLASSES, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
