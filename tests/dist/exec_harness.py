"""Run many executor cases in one spawned gloo group and compare each to the reference.

``run_cases(world_size, cases)`` spawns ``world_size`` processes once; each case is
(name, model name, plan kwargs) and yields, per case, the verdict of `autoplan run --verify`
(autoplan.execute.job.reference: several steps, each against a single-process reference) with
the largest relative difference of the loss, every gradient and every updated weight, or the
error text when the case raised.

The ranks fork from one fork server per test process (multiprocessing's ``forkserver``), which
imports torch, DTensor, FSDP2, dynamo, inductor and the executor once (:data:`PRELOAD`); a spawned rank
imported them again for every group, 3-4 s of CPU per rank (a group of 8 on 2 cores: 15 s before
its first case), and a group's first compiled case imported inductor (two compiled cases in one group
20.0, 23.5 -> 15.7, 13.8 s, alternating runs on the 2-core dev machine under load). A forked rank
gets the environment of the call (:func:`_spawn` passes it: the server's own is from when it started)
and, as a spawned one, its sys.path and working directory.
It freezes the heap it was forked with (``gc.freeze``): those ~300K long-lived objects were rescanned
by every full collection, the audit's one a case among them (0.14 s each): 16.5 -> 13.7 s of a
rank's CPU over the audit's first 30 cases, alternating runs on the 2-core dev machine.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autoplan.jobs.launcher import free_port
from autoplan.types.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"gpt": "TinyGPT", "gpt_tied": "TiedGPT", "gpt_encdec": "EncoderDecoderGPT", "llama": "TinyLlama",
          "llama3p": "ThirdPartyLlama", "moe": "TinyMoE", "moe_skewed": "SkewedMoE",
          "gpt_bidirectional": "BidirectionalGPT", "llama_enable_gqa": "SdpaGQALlama", "lora": "LoRALlama",
          "gpt_sparse": "SparseGPT", "gpt_window_mask": "WindowMaskedGPT"}  # fmt: skip


def blocks_of(model_name: str) -> list[str]:
    import exec_models as m

    prefix = "h" if model_name.startswith("gpt") else "layers"
    return [f"{prefix}.{i}" for i in range(m.LAYERS)]


def make_plan(model_name: str, **kw) -> Plan:
    import exec_tp_plans as tp_plans

    pp = kw.get("pp", 1)
    blocks = blocks_of(model_name)
    chunks = pp * kw.get("virtual_stages", 1)
    per = len(blocks) // chunks
    kw.setdefault("stages", [blocks[i * per : (i + 1) * per] for i in range(chunks)])
    sp = kw.get("sequence_parallel", False)
    if kw.get("tp", 1) > 1 and "tp_plan" not in kw:  # TinyMoE: the default (Megatron) plan
        megatron = tp_plans.gpt_tp_plan if model_name in ("gpt", "gpt_window_mask") else tp_plans.llama_tp_plan
        kw["tp_plan"] = {} if model_name.startswith("moe") else megatron(sp)
    kw.setdefault("micro_batch_size", 2)
    kw.setdefault("num_microbatches", 2)
    for axis in ("dp", "tp", "pp", "cp"):
        kw.setdefault(axis, 1)
    kw["devices"] = kw["dp"] * kw["cp"] * kw["tp"] * kw["pp"]
    return Plan(**kw)


def run_case(model_name: str, plan: Plan) -> dict:
    """Train as `autoplan run --verify` does (dropout off, fp16's skipped steps not compared) until
    the reference has compared as many steps as it asks; the verdict `autoplan run` prints
    (``passed``, ``report``) and, per tensor, its largest relative difference over those steps."""
    import exec_models as m

    from autoplan.execute import parallelize, rng
    from autoplan.execute.job.reference import Reference, verdict, verify_steps

    build = getattr(m, MODELS[model_name])
    torch.manual_seed(0)
    model, reference = build(), build()
    reference.load_state_dict(model.state_dict())
    inputs, target = (m.tokens(plan.global_batch_size, 1),), m.tokens(plan.global_batch_size, 2)
    mb = (m.tokens(plan.micro_batch_size, 3),)
    trainer = parallelize(model, plan, loss_fn=m.lm_loss, microbatch_inputs=mb)
    follower = Reference(model=reference, plan=trainer.plan, loss_fn=m.lm_loss, policy=trainer.policy)
    x, y = trainer.local_batch(inputs, target)
    with rng.dropout_off() as randomness:
        for step in range(8 + verify_steps(plan)):  # fp16 skips steps whose scaled gradients overflow
            loss = trainer.reduce_loss(trainer.train_step(x, y))
            if not trainer.last_step_skipped:
                follower.check(trainer=trainer, inputs=inputs, target=target, loss=loss, step=step)
            if follower.done:
                break
    passed, report = verdict(checks=follower.checks, plan=trainer.plan, randomness=rng.describe(randomness))
    worst: dict[str, float] = {}
    for check in follower.checks:
        for d in check.diffs:
            worst[d.name] = max(worst.get(d.name, 0.0), d.relative)
    return {"passed": passed, "report": report, "diffs": worst, "steps": [c.step for c in follower.checks]}


#: what the fork server imports once for every rank it forks (module docstring)
PRELOAD = (
    "torch",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch._dynamo",
    "torch._inductor.compile_fx",  # the compiled cases' (execute/compiled.py)
    "autoplan.execute.api",
    "autoplan.execute.job.reference",
    "autoplan.execute.job.audit",
    "exec_models",
    "exec_tp_plans",
)


def _worker(rank: int, world_size: int, port: int, cases: list, queue, case_fn=None, environ=None) -> None:
    """One rank: every case through ``case_fn`` (default :func:`run_case`), or through its own function where the
    case names one as a fourth item (cases that differ in what they run sharing one group), results to ``queue``.
    A case's third item is its :func:`make_plan` keywords, or a :class:`Plan` of its own."""
    if environ is not None:  # the caller's, not the fork server's (module docstring)
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gc.freeze()  # the preloaded modules' objects: no collection of this rank rescans them (module docstring)
    torch.set_num_threads(1)
    from datetime import timedelta

    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=int(os.environ.get("AUTOPLAN_TEST_TIMEOUT_S", "60"))),
    )
    for name, model_name, kw, *own in cases:
        try:
            plan = kw if isinstance(kw, Plan) else make_plan(model_name, **kw)  # a case may bring its own plan
            result = (own[0] if own else case_fn or run_case)(model_name, plan)
        except Exception:
            result = {"error": traceback.format_exc()}
        if rank == 0 or "error" in result:
            queue.put((name if rank == 0 else f"{name} (rank {rank})", result))
        dist.barrier()
    dist.destroy_process_group()


def _spawn(world_size: int, cases: list, case_fn=None) -> dict[str, dict]:
    """Run the cases on ``world_size`` spawned ranks and collect what they queue. The queue is
    drained while they run: a rank whose results do not fit the pipe cannot exit until read."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # taken when the server starts: the first group of the process
    queue = ctx.Queue()
    args = (world_size, free_port(), cases, queue, case_fn, dict(os.environ))
    context = mp.start_processes(_worker, args=args, nprocs=world_size, start_method="forkserver", join=False)
    results = {}
    done = False
    while not done:
        done = context.join(timeout=0.2)
        while not queue.empty():
            name, result = queue.get()
            results[name] = result
    return results


def run_cases(world_size: int, cases: list) -> dict[str, dict]:
    return _spawn(world_size, cases)


def audit_case(model_name: str, plan: Plan) -> dict:
    """Two warm-up steps (DDP rebuilds its buckets, optimizers create their states), then one
    audited step; every rank's audit, gathered on rank 0, with its pipeline stage."""
    import exec_models as m

    from autoplan.execute import parallelize
    from autoplan.execute.job.audit import audit_ranks

    torch.manual_seed(0)
    model = getattr(m, MODELS[model_name])()
    trainer = parallelize(model, plan, loss_fn=m.lm_loss, microbatch_inputs=(m.tokens(plan.micro_batch_size, 3),))
    x, y = trainer.local_batch((m.tokens(plan.global_batch_size, 1),), m.tokens(plan.global_batch_size, 2))
    for _ in range(2):
        trainer.train_step(x, y)
    return {"ranks": audit_ranks(trainer, x, y)}


def run_audits(world_size: int, cases: list) -> dict[str, dict]:
    """Audit each case in one spawned gloo group (see :func:`audit_case`)."""
    return _spawn(world_size, cases, audit_case)


def run_verified(model: Path, plan: Path, out: Path, *, timeout: float = 300) -> None:
    """``autoplan run MODEL --plan PLAN --steps 2 --verify --out OUT`` from the repository root, as a user
    types it: it exits 0 and its verify PASSED."""
    command = [sys.executable, "-m", "autoplan.cli", "run", str(model), "--plan", str(plan), "--steps", "2",
               "--verify", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout


def cli_here(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """A planning command (``plan``, ``replan``: no process group) in this process, under ``env`` added to the
    environment: the CLI's own main, its exit code and what it printed, without a fresh interpreter's imports
    (1.5-2 s of CPU a command)."""
    from autoplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(map(str, args)))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
