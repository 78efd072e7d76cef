"""Activation offload exported where the framework can say it (Megatron-LM's --cpu-offloading-num-layers,
started by test_megatron.py), and one sentence where it cannot (docs/export.md, "Activation offload")."""

from __future__ import annotations

import pytest

from autoplan.export.api import export_plan
from autoplan.export.common import ModelFacts
from autoplan.export.megatron import export as megatron_export
from autoplan.types.plan import Plan

FACTS = ModelFacts(layers=4, hidden_size=256, num_heads=8, num_kv_heads=8, seq_len=128, vocab_size=1024)


def _plan(**kw) -> Plan:
    base = dict(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1, precision="bf16")
    return Plan(**{**base, "offload_activations": True, **kw})


def test_megatron_offloads_all_layers_but_the_last_and_says_so():
    exported = megatron_export(_plan(), FACTS)
    assert "--cpu-offloading-num-layers 3" in exported.text
    assert any("at most num_layers - 1 = 3 layers" in note for note in exported.unexpressed)
    assert "--cpu-offloading" not in megatron_export(_plan(offload_activations=False), FACTS).text  # no note either


@pytest.mark.parametrize("kw, why", [(dict(recompute="full", recompute_blocks=[2]), "activation recomputation")])
def test_megatron_refuses_it_beside_recompute_in_one_sentence(kw, why):
    exported = megatron_export(_plan(**kw), FACTS)
    assert "--cpu-offloading-num-layers" not in exported.text
    assert f"offload_activations with {why}: Megatron-LM's --cpu-offloading refuses" in " ".join(exported.unexpressed)


@pytest.mark.parametrize(
    "to, words",
    [
        ("torchtitan", "torchtitan 0.3.0's job config has no activation offload"),
        ("deepspeed", "DeepSpeed's cpu_checkpointing offloads only the checkpoints"),
        ("accelerate", "Accelerate has no activation offload switch"),
    ],
)
def test_the_others_say_in_one_sentence_that_they_cannot(to, words):
    exported = export_plan(_plan(), to=to, graph=None)
    assert any(note.startswith("offload_activations: " + words) for note in exported.unexpressed)
