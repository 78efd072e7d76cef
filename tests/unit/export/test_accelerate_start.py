"""Accelerate starts from what autoplan hands over: on every machine, the printed launch command
(``accelerate launch --config_file ... --machine_rank R --main_process_ip IP --main_process_port P``)
goes through ``accelerate launch``'s own parsing and ``prepare_multi_gpu_env``, and the rendezvous
it hands torchrun must be machine 0's; on two ranks (slow), two one-process "machines" start
``Accelerator()`` in that environment and take one accumulated optimizer step together.

Accelerate runs FSDP only on accelerators (``AcceleratorState`` turns ``ACCELERATE_USE_FSDP`` into
``DistributedType.FSDP`` for MULTI_GPU-like types, never for MULTI_CPU), so on the CPU the start
is the DDP families'; test_accelerate.py builds the FSDP and parallelism plugins of the others.
"""

from __future__ import annotations

import os
import shlex

import pytest
import torch
import yaml

from autoplan.export import accelerate as acc_export
from autoplan.export.common import ModelFacts
from autoplan.jobs.launcher import free_port
from autoplan.jobs.spawn import report, spawn_ranks
from autoplan.types import Plan

FACTS = ModelFacts(name="tiny")
MULTI_NODE = {
    "zero3-bf16": Plan(devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=3,
                       precision="bf16", grad_reduce_dtype="bf16"),
    "ddp-fp32": Plan(devices=24, dp=24, tp=1, pp=1, micro_batch_size=2, num_microbatches=1),
    "tp2-pp2-zero1": Plan(devices=32, dp=8, tp=2, pp=2, micro_batch_size=1, num_microbatches=8, zero_stage=1,
                          precision="bf16"),
}  # fmt: skip
#: Two one-process machines: what the slow test starts.
TWO_MACHINES = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, precision="bf16")


def machine_launch(exported, path, machine_rank: int, address: str):
    """What the printed command does on machine ``machine_rank``: Accelerate's parsed arguments and
    the environment it hands torchrun."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    command = exported.launch.replace("$MACHINE_RANK", str(machine_rank)).replace("$MAIN_PROCESS_IP", address)
    argv = shlex.split(command.replace(acc_export.FILENAME, str(path)))
    assert argv[:2] == ["accelerate", "launch"] and "$" not in command
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv[2:]))
    return args, prepare_multi_gpu_env(args)


def rendezvous(args) -> str:
    """The ``host:port`` torchrun meets at: Accelerate passes it as rdzv_endpoint, or as
    master_addr/master_port on ``--same_network``."""
    return args.rdzv_endpoint if getattr(args, "rdzv_endpoint", None) else f"{args.master_addr}:{args.master_port}"


@pytest.fixture(scope="module", autouse=True)
def _accelerate():
    pytest.importorskip("accelerate", reason="Accelerate is not installed (pip install accelerate)")


@pytest.mark.parametrize("name", MULTI_NODE)
def test_every_machine_meets_at_machine_0_with_its_own_rank(name, tmp_path):
    plan, port = MULTI_NODE[name], free_port()
    exported = acc_export.export(plan, FACTS, main_process_port=port)
    path = tmp_path / exported.filename
    path.write_text(exported.text)
    machines = -(-plan.devices // 8)
    assert "--machine_rank $MACHINE_RANK --main_process_ip $MAIN_PROCESS_IP" in exported.launch
    assert exported.launch in exported.text  # the file says how to launch it, too
    for rank in range(machines):
        args, _ = machine_launch(exported, path, rank, "10.1.2.3")
        assert rendezvous(args) == f"10.1.2.3:{port}"
        assert (args.node_rank, args.nnodes, args.nproc_per_node) == (rank, str(machines), "8")


def test_the_file_alone_names_machine_0_and_a_given_address_is_written(tmp_path):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    plan = MULTI_NODE["zero3-bf16"]
    data = yaml.safe_load(acc_export.export(plan, FACTS).text)
    assert (data["main_process_ip"], data["main_process_port"]) == (acc_export.MACHINE_0, 29500)
    exported = acc_export.export(plan, FACTS, main_process_ip="10.9.8.7", main_process_port=free_port())
    path = tmp_path / exported.filename
    path.write_text(exported.text)
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "t.py"]))
    prepare_multi_gpu_env(args)  # launched without flags: the file's machine 0, never the string "None"
    assert rendezvous(args).startswith("10.9.8.7:") and "--main_process_ip 10.9.8.7" in exported.launch
    single = acc_export.export(Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1), FACTS)
    assert "main_process_ip" not in yaml.safe_load(single.text) and "--machine_rank" not in single.launch


def _machine(rank, world, port, folder, messages):
    def work():
        exported = acc_export.export(TWO_MACHINES, FACTS, devices_per_node=1, main_process_port=port)
        path = os.path.join(folder, f"machine{rank}.yaml")
        with open(path, "w") as file:
            file.write(exported.text)
        args, env = machine_launch(exported, path, rank, "127.0.0.1")
        host, rdzv_port = rendezvous(args).split(":")
        nproc = int(args.nproc_per_node)  # torchrun's variables for its one worker on this machine
        torchrun = {"MASTER_ADDR": host, "MASTER_PORT": rdzv_port, "RANK": str(args.node_rank * nproc),
                    "LOCAL_RANK": "0", "WORLD_SIZE": str(int(args.nnodes) * nproc),
                    "LOCAL_WORLD_SIZE": str(nproc)}  # fmt: skip
        os.environ.update({**env, **torchrun})
        return _one_step()

    report(messages, rank, work)


def _one_step() -> dict:
    """The training script the file's notes describe: Accelerator(gradient_accumulation_steps=...)
    on the CPU, one optimizer step over the accumulated micro-batches."""
    from accelerate import Accelerator

    plan = TWO_MACHINES
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=plan.num_microbatches)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    torch.manual_seed(1 + accelerator.process_index)  # each rank its own data
    for _ in range(plan.num_microbatches):
        with accelerator.accumulate(model), accelerator.autocast():
            accelerator.backward(model(torch.randn(plan.micro_batch_size, 8)).float().pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    return {"type": str(accelerator.distributed_type), "processes": accelerator.num_processes,
            "precision": accelerator.mixed_precision, "synced": accelerator.sync_gradients,
            "weights": [p.detach().flatten().tolist() for p in model.parameters()]}  # fmt: skip


@pytest.mark.slow
def test_two_machines_start_accelerator_from_the_printed_command_and_step_together(tmp_path):
    ranks = spawn_ranks(_machine, processes=2, args=(str(tmp_path),), timeout_s=300, what="starting Accelerate")
    for rank in (0, 1):
        ran = ranks[rank]
        assert (ran["type"], ran["processes"], ran["precision"], ran["synced"]) == (
            "DistributedType.MULTI_CPU", 2, "bf16", True)  # fmt: skip
    for mine, theirs in zip(ranks[0]["weights"], ranks[1]["weights"]):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs))  # DDP averaged the two machines' gradients
