"""Hugging Face transformers GPT-2, built from a config (no weights downloaded). It does not
trace with torch.fx, so autoplan falls back to torch.export. Needs `pip install -e '.[hf]'`.
Sizes overridable with AUTOPLAN_HF_GPT2_<NAME> for LAYERS, DIM, HEADS, VOCAB, SEQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _hf_common import env_size, logits_loss, token_batch  # noqa: E402

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as exc:  # one clear line from autoplan's model-file loader
    raise ImportError(
        "examples/hf_gpt2.py needs Hugging Face transformers; install it with: pip install -e '.[hf]'"
    ) from exc

PREFIX = "AUTOPLAN_HF_GPT2"
LAYERS = env_size(PREFIX, "LAYERS", 2)
DIM = env_size(PREFIX, "DIM", 256)
HEADS = env_size(PREFIX, "HEADS", 4)
VOCAB = env_size(PREFIX, "VOCAB", 8000)
SEQ = env_size(PREFIX, "SEQ", 128)


def build_model():
    config = GPT2Config(
        n_layer=LAYERS,
        n_embd=DIM,
        n_head=HEADS,
        vocab_size=VOCAB,
        n_positions=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


def example_inputs(batch_size):
    return (token_batch(VOCAB, SEQ, batch_size),)


def example_target(batch_size):
    return token_batch(VOCAB, SEQ, batch_size)


loss_fn = logits_loss
