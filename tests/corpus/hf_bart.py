"""Hugging Face ``BartForConditionalGeneration``, 4 + 4 layers, built from a config (no weights downloaded): its
inputs are ids, a padding mask and the labels (9th positional argument), and it returns its own loss. Under a
zero-bubble schedule of pp = 2 (zbv: 4 chunks) one chunk holds the encoder's last layer and the decoder's first two,
which read the encoder's states that the chunk also sends on (tests/dist/test_hf_models.py)."""

import torch

try:
    from transformers import BartConfig, BartForConditionalGeneration
except ImportError as exc:
    raise ImportError("tests/corpus/hf_bart.py needs Hugging Face transformers: pip install -e '.[hf]'") from exc

V, S = 512, 32


def build_model():
    config = BartConfig(
        vocab_size=V, d_model=64, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=S,
        use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        attn_implementation="sdpa",
    )  # fmt: skip
    return BartForConditionalGeneration(config)


def _padding(batch_size):
    mask = torch.ones(batch_size, S, dtype=torch.long)
    for i in range(batch_size):
        mask[i, S - (i % 4) * 3 :] = 0
    return mask


def example_inputs(batch_size):
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(3, V, (batch_size, S), generator=g), torch.randint(3, V, (batch_size, S), generator=g)
    return (ids, _padding(batch_size), None, None, None, None, None, None, labels)


def loss_fn(output, target=None):
    return output.loss
