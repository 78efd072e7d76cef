"""An encoder-decoder whose two token sequences differ in length (8 and 7 tokens), as T5 and BART
are trained: the decoder's length shows in no input the planner reads first, and tp=2 divides one
sequence but not the other, so sequence parallelism must not be offered at tp=2."""

import torch
import torch.nn as nn

VOCAB, DIM, ENCODER_LEN, DECODER_LEN = 64, 32, 8, 7


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x, context=None):
        h = self.norm(x if context is None else x + context.mean(dim=1, keepdim=True))
        return x + self.down(torch.relu(self.up(h)))


class EncoderDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.encoder = nn.ModuleList(Block() for _ in range(2))
        self.decoder = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, source_ids, target_ids):
        memory = self.embed(source_ids)
        for block in self.encoder:
            memory = block(memory)
        x = self.embed(target_ids)
        for block in self.decoder:
            x = block(x, memory)
        return self.head(x)


def build_model():
    return EncoderDecoder()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, ENCODER_LEN)), torch.randint(0, VOCAB, (batch_size, DECODER_LEN)))
