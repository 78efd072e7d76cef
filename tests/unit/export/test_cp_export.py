"""Context parallelism out to each framework and back (docs/export.md, "Context parallelism"):
what each reader makes of the frameworks' cp settings, what each exporter says it cannot express,
and ``explain --config`` pricing a cp config instead of listing it as not priced. Each framework's
own start-up check of exported cp plans lives with that framework's harness (test_megatron.py,
test_torchtitan_py.py, test_torchtitan_toml.py, test_accelerate.py, test_deepspeed_start.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import autoplan.trace
from autoplan.cli import main
from autoplan.export import accelerate as acc_export
from autoplan.export import deepspeed as ds_export
from autoplan.export import megatron
from autoplan.export import torchtitan as titan
from autoplan.export.common import ExportError, ModelFacts
from autoplan.export.torchtitan_flavours import Flavour, Registry, facts_shape
from autoplan.types import Plan

ULYSSES = Plan(devices=4, dp=2, tp=1, pp=1, cp=2, cp_variant="ulysses", micro_batch_size=1, num_microbatches=2,
               precision="bf16")  # fmt: skip
GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")  # 4 layers, hidden 512, 8 heads, seq 512


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    """examples/llama.py: 8 heads, 2 KV heads, seq_len 256."""
    return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def registry(facts) -> Registry:
    """A 0.2.2 registry holding the traced shape (test_torchtitan_toml.py's)."""
    flavours = [Flavour("llama3", "debugmodel", None, facts_shape(facts))]
    return Registry(version="0.2.2", flavours=flavours, input_modules=["tok_embeddings"], output_modules=["norm"])


# ---- Megatron-LM ---------------------------------------------------------------------------
def test_read_takes_megatrons_cp_comm_types():
    """Each --cp-comm-type Megatron-LM takes (TransformerConfig.cp_comm_type) is a cp variant; per-layer
    types and the hierarchical a2a+p2p are read as the nearest, saying so; what Megatron refuses is refused."""
    base = "--context-parallel-size 4 --tensor-model-parallel-size 2 --bf16"
    for comm, variant in (("all_gather", "allgather"), ("p2p", "ring"), ("a2a", "ulysses")):
        imported = megatron.read(f"{base} --cp-comm-type {comm}", devices=16)
        assert (imported.fields["cp"], imported.fields["cp_variant"], imported.fields["dp"]) == (4, variant, 2)
        assert imported.unmapped == []
    mixed = megatron.read(f"{base} --num-layers 3 --cp-comm-type a2a p2p a2a", devices=16)
    assert mixed.fields["cp_variant"] == "ulysses" and "read as a2a" in mixed.unmapped[0]
    hierarchical = megatron.read(f"{base} --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2", devices=8)
    assert hierarchical.fields["cp_variant"] == "ring" and "a2a within groups of 2" in hierarchical.unmapped[0]
    with pytest.raises(ExportError, match="needs --hierarchical-context-parallel-sizes"):
        megatron.read(f"{base} --cp-comm-type a2a+p2p", devices=8)
    with pytest.raises(ExportError, match="product must be --context-parallel-size 4"):
        megatron.read(f"{base} --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4", devices=8)
    with pytest.raises(ExportError, match="expected p2p, all_gather, a2a or a2a\\+p2p"):
        megatron.read(f"{base} --cp-comm-type ring", devices=8)
    with pytest.raises(ExportError, match="not divisible by tp 2 x pp 1 x cp 4"):
        megatron.read(base, devices=12)


def test_an_ulysses_export_says_when_the_heads_do_not_split(facts):
    """Megatron's a2a scatters each tensor-parallel rank's KV heads over the cp ranks (2 KV heads here)."""
    fits = megatron.export(ULYSSES, facts)
    assert fits.unexpressed == [] and "--cp-comm-type a2a" in fits.text
    plan = Plan(devices=8, dp=1, tp=2, pp=1, cp=4, cp_variant="ulysses", micro_batch_size=1, num_microbatches=1)
    said = megatron.export(plan, facts).unexpressed
    assert len(said) == 1 and "2 KV heads over tp 2 x cp 4" in said[0]


# ---- torchtitan ----------------------------------------------------------------------------
def test_torchtitan_exports_say_what_it_runs_instead(facts, registry):
    """Ulysses has no torchtitan form, and torchtitan's trainer refuses a sequence 2 x cp (x tp with SP)
    does not divide; both are said in the file and the result."""
    ulysses = titan.export(ULYSSES, facts, fmt="toml", registry=registry)
    assert "torchtitan 0.2.x has no ulysses context parallelism" in " ".join(ulysses.unexpressed)
    assert 'context_parallel_degree = 2\ncontext_parallel_load_balancer = "headtail"' in ulysses.text
    tp = Plan(devices=8, dp=2, tp=2, pp=1, cp=2, micro_batch_size=1, num_microbatches=1, zero_stage=3,
              sequence_parallel=True)  # fmt: skip
    short = ModelFacts(**{**facts.__dict__, "seq_len": 12})
    said = " ".join(titan.export(tp, short, fmt="toml", registry=registry).unexpressed)
    assert "seq_len 12 is not divisible by 8 (2 x cp, times tp with sequence parallelism)" in said


def test_read_takes_context_parallelism_as_torchtitan_trains_it():
    """cp ranks are FSDP's (dp_shard x cp), so ZeRO follows the reshard policy even without dp; what
    0.2.2 would run otherwise is said, and a sequence its trainer refuses is refused."""
    text = "[training]\nseq_len = 64\n[parallelism]\ncontext_parallel_degree = 4\ndata_parallel_shard_degree = 1\n"
    plain = titan.read(text, devices=4)
    assert (plain.fields["cp"], plain.fields["dp"], plain.fields["zero_stage"]) == (4, 1, 3)
    assert "context" not in " ".join(plain.unmapped)
    other = titan.read(
        text + 'context_parallel_load_balancer = "ptrr"\ncontext_parallel_rotate_method = "alltoall"\n', devices=4
    )
    said = " ".join(other.unmapped)
    assert "ptrr: autoplan prices head-tail" in said and "only in validation" in said
    assert other.fields["cp_variant"] == "allgather"
    hsdp = "[parallelism]\ndata_parallel_replicate_degree = 2\ncontext_parallel_degree = 2\n"
    hsdp += "data_parallel_shard_degree = 1\n"
    replicated = titan.read(hsdp, devices=4)  # FSDP over the cp ranks, replicated over dp: HSDP beside cp
    fields = replicated.fields
    assert (fields["dp"], fields["dp_replicate"], fields["cp"], fields["zero_stage"]) == (2, 2, 2, 3)
    assert not any("replicate" in note for note in replicated.unmapped)
    with pytest.raises(ExportError, match="seq_len 12 is not divisible by 8"):
        titan.read(text.replace("64", "12"), devices=4)


def test_read_takes_a_recipe_with_context_parallelism():
    """A 0.3 recipe: FlexAttention's cp all-gathers keys and values whatever torch's SDPA rotation is set
    to, so a set_rotate_method("alltoall") is said and read as allgather; so is having no load balancer,
    under which causal attention costs the cp ranks unequal work."""
    recipe = """
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torchtitan.config import ParallelismConfig, TrainingConfig
    def long_context():
        set_rotate_method("alltoall")
        return Trainer.Config(
            training=TrainingConfig(local_batch_size=1, seq_len=131072),
            parallelism=ParallelismConfig(context_parallel_degree=8, context_parallel_load_balancer=None),
        )
    """
    imported = titan.read(textwrap.dedent(recipe), devices=64)
    assert (imported.fields["cp"], imported.fields["cp_variant"], imported.fields["dp"]) == (8, "allgather", 8)
    assert imported.fields["zero_stage"] == 3  # FSDP over dp_shard x cp, resharded (no PP)
    said = " ".join(imported.unmapped)
    assert "context_parallel_load_balancer = None" in said and "FlexAttention" in said


# ---- explain --config ----------------------------------------------------------------------
ACCELERATE_SP = "distributed_type: DEEPSPEED\nnum_processes: 8\nparallelism_config:\n  parallelism_config_sp_size: 2\n"
DEEPSPEED_SP = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "sequence_parallel_size": 2,
                "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text", "variant"),
    [
        ("args.txt", "--num-layers 4 --seq-length 512 --context-parallel-size 2 --cp-comm-type p2p --bf16 "
                     "--global-batch-size 16", "ring"),
        ("job.toml", "[training]\nseq_len = 512\nglobal_batch_size = 16\nlocal_batch_size = 4\n[parallelism]\n"
                     "context_parallel_degree = 2\ndata_parallel_shard_degree = 4\n", "allgather"),
        ("accelerate.yaml", ACCELERATE_SP, "ulysses"),
        ("ds_config.json", json.dumps(DEEPSPEED_SP), "ulysses"),
    ],
)  # fmt: skip
def test_explain_prices_a_cp_config_instead_of_listing_it(tmp_path, capsys, name, text, variant):
    """The config's plan keeps its cp and variant, nothing about it is listed as not priced, and its
    step time holds the exposed key/value exchange of that variant (cost/cp/, the pricing helper's)."""
    config = tmp_path / name
    config.write_text(text)
    argv = ["--json", "explain", "--config", str(config), "--model", GPT, "--profile", "dgx-a100", "--devices", "8"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config_plan"].startswith(f"dp=4 cp=2({variant})")
    assert not [u for u in result["unmapped"] if "context" in u or "sequence_parallel" in u]
    exchange = next(t for t in result["terms"] if t["term"] == "cp_comm_s")
    assert exchange["config_s"] > 0


def test_a_cp_the_model_cannot_split_is_refused_naming_the_config(tmp_path, capsys):
    """Megatron asserts 2cp | seq-length; autoplan's cost model states the same rule for the traced model."""
    config = tmp_path / "args.txt"
    config.write_text("--num-layers 4 --seq-length 512 --context-parallel-size 3 --global-batch-size 16 --bf16\n")
    argv = ["explain", "--config", str(config), "--model", GPT, "--profile", "dgx-a100", "--devices", "6"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "Traceback" not in err
    assert f"'{config}' describes a plan autoplan cannot price: cp=3 splits each sequence into 6" in err


# ---- Accelerate and DeepSpeed --------------------------------------------------------------
def test_accelerate_reads_torch_cp_and_deepspeed_ulysses(facts):
    """cp_size is torch's context parallelism (cp_comm_strategy alltoall: ring); sp_size is DeepSpeed's
    Ulysses; Accelerate refuses both at once and any other strategy, and so does the reader."""

    def yaml_text(sizes: str) -> str:
        return (
            f"distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\nparallelism_config:\n{sizes}"
        )

    ring = acc_export.read(
        yaml_text("  parallelism_config_cp_size: 4\n  parallelism_config_cp_comm_strategy: alltoall\n")
    )
    assert (ring.fields["cp"], ring.fields["cp_variant"], ring.fields["dp"], ring.unmapped) == (4, "ring", 2, [])
    ulysses = acc_export.read(yaml_text("  parallelism_config_sp_size: 2\n"))
    assert (ulysses.fields["cp"], ulysses.fields["cp_variant"], ulysses.fields["dp"]) == (2, "ulysses", 4)
    with pytest.raises(ExportError, match="refuses context and sequence parallelism together"):
        acc_export.read(yaml_text("  parallelism_config_cp_size: 2\n  parallelism_config_sp_size: 2\n"))
    with pytest.raises(ExportError, match="takes allgather or alltoall"):
        acc_export.read(yaml_text("  parallelism_config_cp_size: 2\n  parallelism_config_cp_comm_strategy: ring\n"))
    said = " ".join(acc_export.export(ULYSSES, facts).unexpressed)
    assert "Accelerate's Ulysses is sp_size under DeepSpeed" in said


def test_deepspeed_writes_every_variant_as_its_ulysses_and_says_so(facts):
    ring = Plan(devices=4, dp=2, tp=1, pp=1, cp=2, cp_variant="ring", micro_batch_size=1, num_microbatches=2,
                zero_stage=1)  # fmt: skip
    exported = ds_export.export(ring, facts)
    assert json.loads(exported.text)["sequence_parallel_size"] == 2
    said = " ".join(exported.unexpressed)
    assert "no ring or all-gather context parallelism" in said and "register_with_transformers" in said
    assert "no ring" not in " ".join(ds_export.export(ULYSSES, facts).unexpressed)
    back = ds_export.read(exported.text, devices=4)
    assert (back.fields["cp"], back.fields["cp_variant"], back.fields["dp"]) == (2, "ulysses", 2)
