"""A recompute budget (Plan.recompute_blocks) in each trainer's terms, or the sentence saying it cannot be
said (autoplan/export/recompute_budget.py). Megatron-LM's own start-up check of the flags is in
test_megatron.py (its PLANS "pp2-budget-full" and "zero1-budget-selective")."""

from __future__ import annotations

import tomllib

from autoplan.export import accelerate, deepspeed, megatron
from autoplan.export import torchtitan as titan
from autoplan.export.common import ModelFacts
from autoplan.export.torchtitan_flavours import Flavour, Registry, facts_shape
from autoplan.types import Plan

FACTS = ModelFacts(name="llama", layers=8, hidden_size=256, num_heads=8, num_kv_heads=8, seq_len=128, vocab_size=512)
LAYERS = [f"layers.{i}" for i in range(8)]
HALVES = [LAYERS[:4], LAYERS[4:]]


def _plan(**kw) -> Plan:
    kw.setdefault("pp", 2)
    kw.setdefault("stages", HALVES if kw["pp"] == 2 else [])
    fields = dict(dp=1, tp=1, micro_batch_size=1, num_microbatches=4, precision="bf16", recompute="full")
    return Plan(**{"devices": kw["pp"], **fields, **kw})


def _registry() -> Registry:
    ends = {"input_modules": ["tok_embeddings"], "output_modules": ["norm", "output"]}
    return Registry(version="0.2.2", flavours=[Flavour("llama3", "debugmodel", None, facts_shape(FACTS))], **ends)


def _flags(text: str) -> str:
    return " ".join(line for line in text.splitlines() if not line.startswith("#"))


def test_megatron_recomputes_the_first_k_layers_of_each_chunk():
    same = megatron.export(_plan(recompute_blocks=[3, 3]), FACTS)
    assert "--recompute-method block --recompute-num-layers 3" in _flags(same.text)
    assert not [n for n in same.unexpressed if "recompute_blocks" in n]
    differ = megatron.export(_plan(recompute_blocks=[3, 1]), FACTS)
    assert "--recompute-num-layers 3" in _flags(differ.text)
    assert any("one count for every pipeline chunk; written as the largest, 3" in n for n in differ.unexpressed)
    selective = megatron.export(_plan(recompute="selective", recompute_blocks=[3, 1]), FACTS)
    assert "--recompute-num-layers" not in _flags(selective.text)
    assert any("selective granularity has no layer count" in n for n in selective.unexpressed)
    none = megatron.export(_plan(recompute_blocks=[0, 0]), FACTS)
    assert "--recompute" not in _flags(none.text)  # no block recomputes


def test_megatron_reads_a_block_count_back_as_a_budget():
    imported = megatron.read(megatron.export(_plan(recompute_blocks=[2, 2]), FACTS).text, devices=2)
    assert (imported.fields["recompute"], imported.fields["recompute_blocks"]) == ("full", [2, 2])
    assert not imported.unmapped


def _activation_checkpoint(plan: Plan) -> tuple[dict, list[str]]:
    exported = titan.export(plan, FACTS, fmt="toml", registry=_registry())
    return tomllib.loads(exported.text)["activation_checkpoint"], exported.unexpressed


def test_torchtitan_toml_says_every_nth_block_when_that_gives_the_counts():
    section, notes = _activation_checkpoint(_plan(recompute_blocks=[2, 2]))  # floor(4 / 2) = 2 per stage
    assert section == {"mode": "selective", "selective_ac_option": "2"}
    assert any("selective_ac_option = 2" in n and "not the first ones" in n for n in notes)
    section, notes = _activation_checkpoint(_plan(recompute_blocks=[3, 1]))  # no N gives 3 and 1 of 4
    assert section == {"mode": "full"}
    assert any("no N gives these counts; written as mode 'full' for every block" in n for n in notes)


def test_trainers_that_checkpoint_every_block_say_so():
    plan = _plan(pp=1, recompute_blocks=[5])
    py = titan.export(plan, FACTS, fmt="py", registry=_registry())
    ds = deepspeed.export(plan, FACTS)
    acc = accelerate.export(_plan(pp=1, dp=2, devices=2, zero_stage=3, recompute_blocks=[5]), FACTS)  # FSDP's switch
    for trainer, exported in (("torchtitan 0.3", py), ("DeepSpeed", ds), ("Accelerate", acc)):
        notes = [n for n in exported.unexpressed if n.startswith("recompute_blocks 5 (full)")]
        assert len(notes) == 1 and trainer in notes[0] and "written as every block" in notes[0], exported.unexpressed
    # a single-device or DDP config has no checkpointing key at all: nothing is written as every block
    said = " ".join(accelerate.export(plan, FACTS).unexpressed)
    assert "single-device (NO) config has no activation-checkpointing key" in said and "every block" not in said
    assert not [n for n in deepspeed.export(_plan(pp=1), FACTS).unexpressed if "recompute_blocks" in n]


def test_torchtitan_toml_reads_every_nth_block_back_as_the_budget():
    """export -> read -> the same plan: selective_ac_option = "N" recomputes floor(L / N) of each
    chunk's L blocks, whether the chunks are stated as module lists or as layers per stage."""
    uneven = _plan(recompute_blocks=[2, 1], stages=[LAYERS[:5], LAYERS[5:]])  # N = 2: floor(5 / 2), floor(3 / 2)
    for plan in (
        _plan(recompute_blocks=[2, 2]),
        _plan(pp=1, recompute_blocks=[2]),
        _plan(recompute_blocks=[1, 1]),
        uneven,
    ):
        text = titan.export(plan, FACTS, fmt="toml", registry=_registry()).text
        imported = titan.read(text, devices=plan.devices)
        assert (imported.fields["recompute"], imported.fields["recompute_blocks"]) == ("full", plan.recompute_blocks)
        assert not [n for n in imported.unmapped if "selective_ac_option" in n], imported.unmapped
