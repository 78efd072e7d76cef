"""``explain --config`` prices a config as it was written: refused when it states another model
than the one traced, its open batch values taken from ``--batch``, every assumption printed, and
compared with the best plan at the config's own precision, with plan's ``--fix`` and ``--allow-*``
(docs/export.md "Reading a config back")."""

import json
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.errors import ExportError
from autoplan.export.api import import_config, price_config

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")  # 4 layers, hidden 512, 8 heads, seq 512
MEGATRON_GPT = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 512 --vocab-size 32000"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _explain(capsys, config: Path, *flags: str, as_json: bool = True) -> tuple[int, str, str]:
    argv = ["explain", "--config", str(config), "--model", GPT, "--profile", "dgx-a100", "--devices", "8", *flags]
    code = main((["--json"] if as_json else []) + argv)
    out, err = capsys.readouterr()
    return code, out, err


# ---- the config is for the model -----------------------------------------------------------
def test_a_config_for_another_model_is_refused_in_one_sentence(tmp_path, capsys):
    text = "--num-layers 40 --hidden-size 512 --num-attention-heads 8 --seq-length 4096 --global-batch-size 16 --bf16"
    code, out, err = _explain(capsys, _write(tmp_path, "args.txt", text))
    assert code == 2 and not out and err.count("\n") == 1 and "Traceback" not in err
    assert "layers 40 in the config, 4 in the model" in err
    assert "sequence length 4096 in the config, 512 in the model" in err
    assert "hidden size" not in err and "--model" in err  # only what differs, and what to do


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("job.toml", '[job]\ndescription = "x, 40 layers"\n[training]\nseq_len = 512\n', "layers 40 in the config, 4"),
        ("gqa.txt", "--num-layers 4 --num-attention-heads 8 --global-batch-size 32", "KV heads 8 in the config, 2"),
        ("vocab.txt", "--num-layers 4 --vocab-size 9000 --global-batch-size 32", "vocabulary 9000 in the config, 8064"),
    ],
)
def test_every_framework_is_checked_by_what_it_states(tmp_path, name, text, words):
    """torchtitan's layer count, Megatron's implied KV heads (no --group-query-attention: one per
    head) and its vocabulary: one check for every reader."""
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, kv_heads=2, vocab=8064, seq=512, batch=32)
    with pytest.raises(ExportError, match=words):
        price_config(_write(tmp_path, name, text), graph=graph, profile=synthetic_profile(), devices=8)


def test_unstated_facts_and_megatrons_padded_vocabulary_are_accepted_and_named(tmp_path):
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8064, seq=128, batch=32)
    args = "--num-layers 4 --hidden-size 256 --vocab-size 8000 --global-batch-size 32 --bf16"  # Megatron pads to 8064
    priced = price_config(_write(tmp_path, "a.txt", args), graph=graph, profile=synthetic_profile(), devices=8)
    assert any("not compared" in a and "attention heads" in a and "layers" not in a for a in priced.assumptions)
    ds = '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true}}'
    priced = price_config(_write(tmp_path, "ds.json", ds), graph=graph, profile=synthetic_profile(), devices=8)
    assert any(
        "layers, hidden size, attention heads, KV heads, sequence length, vocabulary" in a for a in priced.assumptions
    )


# ---- --batch where the config leaves the batch open ----------------------------------------
OPEN_BATCH = {
    "deepspeed": ("ds.json", '{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", '
                  '"gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 1}}'),
    "megatron": ("args.txt", "--micro-batch-size 2 --bf16"),
    "torchtitan": ("job.toml", "[training]\nlocal_batch_size = 4\n[parallelism]\ndata_parallel_shard_degree = -1\n"),
    "accelerate": ("acc.yaml", "distributed_type: MULTI_GPU\nmixed_precision: bf16\n"),
}  # fmt: skip


@pytest.mark.parametrize("framework", OPEN_BATCH)
def test_batch_fills_what_every_framework_leaves_open_and_says_so(tmp_path, framework):
    name, text = OPEN_BATCH[framework]
    imported = import_config(_write(tmp_path, name, text), devices=8, batch_size=128)
    assert imported.plan().global_batch_size == 128
    assert any("--batch" in a for a in imported.assumptions) and any("world size" in a or "-1" in a or
               "num_processes" in a for a in imported.assumptions)  # fmt: skip


def test_a_batch_the_config_overrides_is_named(tmp_path):
    path = _write(tmp_path, "args.txt", "--micro-batch-size 2 --global-batch-size 64")
    imported = import_config(path, devices=8, batch_size=128)
    assert imported.plan().global_batch_size == 64
    assert "--batch 128 not used: the config gives a global batch of 64." in imported.assumptions


def test_deepspeed_auto_batches_are_priced_at_the_batch_given(tmp_path, capsys):
    code, out, err = _explain(capsys, _write(tmp_path, "ds.json", OPEN_BATCH["deepspeed"][1]), "--batch", "64")
    assert code == 0, err
    result = json.loads(out)
    assert " mbs=8x1 " in result["config_plan"]  # 64 samples over 8 ranks, not one per device
    assert 'DeepSpeed train_batch_size "auto": read as 64 from --batch.' in result["assumptions"]


# ---- like for like, and what a change of precision would add --------------------------------
def test_the_best_plan_is_searched_at_the_configs_own_precision(tmp_path, capsys):
    """An fp32 config against an fp32 best plan; the bf16 best is shown on its own line."""
    config = _write(tmp_path, "args.txt", f"{MEGATRON_GPT} --global-batch-size 16")
    code, out, err = _explain(capsys, config)
    assert code == 0, err
    result = json.loads(out)
    assert result["compared_at"] == {"precision": "fp32", "reduce": "fp32"}
    assert result["best_plan"].endswith(" fp32 runtime=megatron") and result["slower"] >= 1 - 1e-9
    faster = result["any_precision"]
    assert " bf16" in faster["plan"] and faster["step_s"] < result["best_step_s"]
    code, out, _ = _explain(capsys, config, as_json=False)
    assert code == 0 and "a change of precision would add" in out and "Assumed in reading the config" in out


def test_explain_config_takes_plans_fix(tmp_path, capsys):
    """--fix is plan's own option: a precision pin replaces the config's, and nothing is left to add."""
    config = _write(tmp_path, "args.txt", f"{MEGATRON_GPT} --global-batch-size 16")
    code, out, err = _explain(capsys, config, "--fix", "precision=bf16,tp=2")
    assert code == 0, err
    result = json.loads(out)
    assert result["compared_at"] == {"precision": "bf16", "reduce": "fp32"} and result["any_precision"] is None
    assert " tp=2 " in result["best_plan"] and result["best_plan"].endswith(" bf16 runtime=megatron")


def test_search_flags_without_a_config_are_refused_not_ignored(tmp_path, capsys):
    """``explain DIR`` explains the folder's own search: a --fix there would be silently ignored."""
    assert main(["explain", str(tmp_path / "plan"), "--fix", "tp=2", "--allow-lossy"]) == 2
    err = capsys.readouterr().err
    assert "--fix, --allow-lossy are for explain --config FILE" in err and err.count("\n") == 1
