"""Megatron-LM launch scripts as people write them, read back for ``explain --config``: shaped like
Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh (variables, arrays with comments,
``\\`` continuations, ``$((...))``, a torchrun launcher), and the continuation that dropped the
first flag of each line (a bf16 ZeRO-1 config priced as fp32, "15.26x" instead of 1.36x)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.export import megatron
from autoplan.export.common import ExportError

ROOT = Path(__file__).resolve().parents[3]

GPT3_SHAPED = r"""#!/bin/bash

# Runs a small GPT, bf16 with the distributed optimizer (ZeRO-1), on 2 nodes

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# Change for multinode config
MASTER_ADDR=localhost
MASTER_PORT=6000
NUM_NODES=2
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

CHECKPOINT_PATH=$1 #<Specify path>
DATA_PATH=$2 #<Specify path and file prefix>_text_document

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

GPT_MODEL_ARGS=(
    --num-layers 4
    --hidden-size 256
    --num-attention-heads 8
    --seq-length 128
    --max-position-embeddings 128
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size $(( 2 * WORLD_SIZE / TP * 4 ))
    --train-iters 500000
    --bf16
    --lr 6.0e-5
)

MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size ${TP:-2}
	--pipeline-model-parallel-size 1
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --data-path $DATA_PATH --save "$CHECKPOINT_PATH" --split '949,50,1' 2>&1 | tee train.log
"""

#: Each flag that begins a line follows a backslash-newline. shlex made each a word starting with a
#: newline, which the old reader took for a value of --pipeline-model-parallel-size: it read fp32
#: ZeRO-0 with one micro-batch, silently.
CONTINUED = r"""--overlap-grad-reduce --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \
--bf16 \
--use-distributed-optimizer \
--global-batch-size 64 \
--micro-batch-size 2 --num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 512
"""


def test_a_script_shaped_like_megatrons_example_reads_as_its_shell_would():
    imported = megatron.read(GPT3_SHAPED.replace("${TP:-2}", "2").replace("/ TP", "/ 2"))
    fields = imported.fields
    assert (fields["devices"], fields["dp"], fields["tp"], fields["pp"]) == (16, 8, 2, 1)  # 8 per node x 2 nodes
    assert (fields["micro_batch_size"], fields["num_microbatches"]) == (2, 4)  # 2 * 16 / 2 * 4 = 64 = 2 x 8 x 4
    assert (fields["precision"], fields["zero_stage"], fields["overlap_grad_reduce"]) == ("bf16", 1, True)
    assert (imported.facts.layers, imported.facts.hidden_size, imported.facts.seq_len) == (4, 256, 128)
    said = " ".join(imported.unmapped)
    for words in ("--attention-backend auto:", "--lr 6.0e-5:", "--data-path $2:", "--save $1:", "--split 949,50,1:"):
        assert words in said
    assert "Can use" not in said and "tee" not in said and "--master_addr" not in said


def test_a_variable_the_script_does_not_assign_is_named():
    """``${TP:-2}`` takes its default; ``TP`` in the arithmetic is unassigned, and it sets a flag autoplan reads."""
    unassigned = r"--global-batch-size \$\(\( 2 \* WORLD_SIZE / TP \* 4 \)\): the script does not assign"
    with pytest.raises(ExportError, match=unassigned):
        megatron.read(GPT3_SHAPED)
    fixed = megatron.read(GPT3_SHAPED.replace("GPUS_PER_NODE=8\n", "GPUS_PER_NODE=8\nTP=2\n"))
    assert fixed.fields["tp"] == 2
    passed_through = megatron.read("torchrun --nproc-per-node 4 pretrain_gpt.py --bf16 $EXTRA ${MORE[@]}")
    assert passed_through.unmapped[0].startswith("$EXTRA, ${MORE[@]}: the script does not assign them")
    assert passed_through.fields["precision"] == "bf16" and passed_through.fields["devices"] == 4


def test_continuations_keep_the_first_flag_of_each_line():
    fields = megatron.read(CONTINUED, devices=8).fields
    assert (fields["precision"], fields["zero_stage"], fields["num_microbatches"]) == ("bf16", 1, 4)


@pytest.mark.parametrize(
    "launcher",
    [
        "torchrun --nnodes 1 --nproc-per-node 8 --rdzv-backend c10d pretrain_gpt.py",
        "python -m torch.distributed.run --nproc_per_node=8 pretrain_gpt.py",
        "CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_DEBUG=WARN python3 -u /opt/megatron/pretrain_gpt.py",
        "deepspeed --num_gpus 8 pretrain_gpt.py",
    ],
)
def test_everything_up_to_the_training_script_is_the_launcher(launcher):
    imported = megatron.read(f"{launcher} {CONTINUED}", devices=None if "8 " in launcher + " " else 8)
    assert imported.fields["devices"] == 8 and imported.fields["precision"] == "bf16"
    assert imported.unmapped == []


def test_quotes_comments_assignments_and_equals_signs_follow_the_shell():
    script = r"""
    export PP=2 LAYERS=8
    MBS=1; GBS="16"  # two commands on a line
    python -m torch.distributed.run --nproc-per-node=4 --nnodes=2 pretrain_gpt.py \
        --pipeline-model-parallel-size=$PP --num-layers "$LAYERS" \
        --micro-batch-size ${MBS} --global-batch-size "${GBS}" \
        --fp16 --wandb-exp-name 'run #3 "quoted"' # a comment with --bf16 in it
    """
    imported = megatron.read(script)
    fields = imported.fields
    assert (fields["devices"], fields["pp"], fields["dp"], fields["num_microbatches"]) == (8, 2, 4, 4)
    assert fields["precision"] == "fp16" and imported.facts.layers == 8
    assert imported.unmapped == ['--wandb-exp-name run #3 "quoted": not a setting autoplan prices; ignored.']


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("echo starting\nls /data\n", "'echo' is neither a --flag nor a launch command"),
        ("torchrun pretrain_gpt.py --bf16 --micro-batch-size 'two\n", "quote that is never closed"),
        ("ARGS=(\n--bf16\n", r"array ARGS=\( is never closed"),
        ("torchrun pretrain_gpt.py --bf16", "do not state the world size"),
        (
            "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 16",
            r"world size 8 \(the launcher's processes per node x nodes: pass --devices\) is not divisible by tp 16",
        ),
    ],
)
def test_a_script_autoplan_cannot_read_is_one_sentence(text, words):
    with pytest.raises(ExportError, match=words):
        megatron.read(text)


def _explain(config: Path, *extra: str, capsys) -> dict:
    model = str(ROOT / "examples" / "gpt.py")
    argv = ["--json", "explain", "--config", str(config), "--model", model, "--profile", "dgx-a100", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_explain_prices_continued_lines_as_the_same_flags_on_one_line(tmp_path, capsys):
    """The "15.26x" trap, through the CLI: continued lines price the plan their flags on one line
    describe (bf16 ZeRO-1), and so does a torchrun script around them. The facts are examples/gpt.py's."""
    continued = tmp_path / "continued_args.txt"
    continued.write_text(CONTINUED)
    priced = _explain(continued, "--devices", "8", capsys=capsys)
    one_line = megatron.read(" ".join(CONTINUED.replace("\\\n", " ").split()), devices=8).plan().describe()
    assert "bf16" in one_line and "zero=1" in one_line
    assert priced["config_plan"] == one_line
    script = "#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py \\\n" + CONTINUED
    assert megatron.read(script).plan().describe() == one_line


def test_explain_refuses_an_unreadable_script_in_one_sentence(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size $TP --bf16\n")
    model = str(ROOT / "examples" / "gpt.py")
    assert main(["explain", "--config", str(script), "--model", model, "--profile", "dgx-a100"]) == 2
    err = capsys.readouterr().err
    assert "$TP" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_quoted_layout_keeps_its_bars_and_the_exported_file_needs_no_quotes():
    """In a script the layout's ``|`` must be quoted (else it is a pipe); in the exporter's file, which
    the launch line word-splits with ``$(grep -v '^#' megatron_args.txt)``, it is a plain character."""
    flags = "--pipeline-model-parallel-size 2 --num-layers 5 --pipeline-model-parallel-layout"
    scripted = megatron.read(f'torchrun --nproc-per-node 2 pretrain_gpt.py {flags} "E|(tt|)*2,tL"')
    exported = megatron.read(f"# world size: 2\n{flags} E|tt|tt|tL\n")
    for imported in (scripted, exported):
        assert imported.fields["virtual_stages"] == 2 and "uneven stages" in imported.unmapped[0]
