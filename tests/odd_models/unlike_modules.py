"""A recurrent language model of three unlike top-level modules (an Embedding, a two-layer
LSTM, a Linear head), registered in another order than forward() calls them; the LSTM's
``batch_first`` output, which the head's stage receives, is a transposed view."""

import torch
import torch.nn as nn

VOCAB, SEQ = 96, 12


class RecurrentLM(nn.Module):
    def __init__(self, width=32, hidden=48):
        super().__init__()
        self.head = nn.Linear(hidden, VOCAB)
        self.rnn = nn.LSTM(width, hidden, num_layers=2, batch_first=True)
        self.embed = nn.Embedding(VOCAB, width)

    def forward(self, tokens):
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def build_model():
    return RecurrentLM()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())
