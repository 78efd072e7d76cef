"""An LSTM language model as a newcomer writes it: nn.Embedding -> nn.LSTM(num_layers=2) -> nn.Linear.
The LSTM runs as one fused recurrent op (aten's mkldnn_rnn_layer / _lstm) that DTensor cannot split,
so no tensor-parallel split of it may be offered."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ = 96, 32, 12


class LSTMLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.lstm = nn.LSTM(DIM, DIM, num_layers=2, batch_first=True)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden)


def build_model():
    return LSTMLanguageModel()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))
