"""One rank of ``autoplan run``: build, parallelize, train S steps, measure, write the run folder.

Started by the launcher (``python -m autoplan.cli.rank OPTIONS`` per local process) or directly
by ``autoplan run`` under an external torchrun (RANK/WORLD_SIZE set), with the run's options
(autoplan/types/run_options.py) and, for ``--elastic``, the planner to call (``replan``, passed in
by autoplan/cli/rank.py: the executor never imports the planner). Rank 0 writes
``measured.csv`` (step, step_time_s, loss, peak_memory_bytes) and ``summary.json`` atomically,
and with ``--audit`` ``audit.csv``: one more, untimed step under the execution audit, measured
per rank beside the prediction written before the ranks started (autoplan/types/audit_prediction.py,
autoplan/execute/job/audit.py).
A step's time is the slowest rank's (all-reduce MAX), measured around ``train_step`` only,
after a device synchronise. Peak memory: CUDA max allocated, or on CPU the process's peak
RSS (``ru_maxrss``), the largest over ranks.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from autoplan.errors import DEBUG_ENV, AutoplanError
from autoplan.execute.job import checkpointing, nonfinite, replicas
from autoplan.execute.job.contract import EXIT_NONFINITE_LOSS, EXIT_STOPPED, EXIT_VERIFY_FAILED
from autoplan.execute.job.failure_hints import failure_hint
from autoplan.execute.job.heartbeats import start_heartbeat
from autoplan.execute.job.outputs import write_outputs
from autoplan.execute.job.reference import reference_copy
from autoplan.execute.job.replicas import ReplicaCheck
from autoplan.execute.job.tracing import StepTracer
from autoplan.jobs.heartbeat import Heartbeat
from autoplan.jobs.threads import threads_per_process
from autoplan.types._check import write_text_atomic
from autoplan.types.audit_prediction import AuditPrediction
from autoplan.types.local_sgd import equals_synchronous
from autoplan.types.plan import Plan
from autoplan.types.run_folder import write_audit
from autoplan.types.run_options import RunOptions

#: ``replan(opts, plan, devices)``: the best plan for ``devices`` ranks in place of ``plan`` (--elastic)
Replan = Callable[[RunOptions, Plan, int], Plan]


def rank_threads(*, requested: int | None, profile_threads: int | None) -> int:
    """--threads, else the profile's ``threads``, else this machine's cores shared by its local
    ranks (jobs/threads.threads_per_process)."""
    if requested:
        return requested
    if profile_threads:
        return profile_threads
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return threads_per_process(processes=local)


def _init(opts: RunOptions) -> None:
    from autoplan.execute.mesh import device_type, local_device

    backend = "nccl" if device_type() == "cuda" else "gloo"
    device = local_device()
    timeout = timedelta(seconds=opts.timeout_s)
    # NCCL bound to this rank's GPU up front: barriers and collectives need not guess it (and warn)
    bound = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timeout, **bound, **_attempt_store(timeout))


def _attempt_store(timeout: timedelta) -> dict[str, Any]:
    """Under torchelastic's shared store, a store of this attempt's own: the agent keeps one store
    across restarts and torch 2.13's env:// rendezvous adds no per-attempt prefix, so a restarted
    rank would read a dead rank's address from the last attempt (gloo: "connectFullMesh failed ...
    Connection refused"). Empty otherwise (env:// as usual)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    from autoplan.execute.job.checkpointing import restart_count

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    return {"store": dist.PrefixStore(f"autoplan/attempt{restart_count()}", shared), "rank": rank, "world_size": world}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _max_over_ranks(value: float, device: torch.device) -> float:
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def run_rank(opts: RunOptions, *, replan: Replan | None = None) -> int:
    """The whole job on this rank; returns the exit code (0, or 3 when --verify fails)."""
    from autoplan.modelfile import load_model_file

    plan = Plan.load(opts.plan)
    model_file = load_model_file(opts.model)
    torch.set_num_threads(rank_threads(requested=opts.threads, profile_threads=opts.profile_threads))
    _init(opts)
    heartbeat = start_heartbeat(opts, plan)  # after the process group: under torchrun it uses the job's store
    try:
        world_plan = plan_for_world(opts=opts, plan=plan, replan=replan)
        code = _train(opts=opts, plan=world_plan, model_file=model_file, heartbeat=heartbeat)
        dist.barrier()  # leave together: rank 0 may still be writing (the audit traces the model) while
        return code  # a peer that tore its process group down first would abort the connection
    except Exception as exc:  # record why before tearing down: peers fail "closed by peer" after it
        record_failure(exc, precision=plan.precision)
        raise
    finally:
        heartbeat.stop()
        dist.destroy_process_group()


def plan_for_world(*, opts: RunOptions, plan: Plan, replan: Replan | None) -> Plan:
    """``plan``, or with --elastic a plan for a job of another size (torchelastic restarted it with
    fewer or more nodes): rank 0 re-plans for the world size with ``replan``, which keeps the global
    batch (autoplan/solve/replan.py, passed in by autoplan/cli/rank.py), and every rank takes its plan."""
    world = dist.get_world_size()
    if dist.get_rank() == 0 and (warning := checkpointing.shared_store_warning(elastic=opts.elastic)):
        print(warning, file=sys.stderr, flush=True)
    if world == plan.devices:
        return plan
    if not opts.elastic:
        raise AutoplanError(
            f"the plan is for {plan.devices} devices but this job has {world} ranks; pass --elastic to re-plan "
            f"for {world}, or make a plan for {world} with `autoplan replan`."
        )
    if replan is None:
        raise AutoplanError(f"--elastic: this job has {world} ranks, not {plan.devices}, and no planner was given.")
    chosen = [None]
    if dist.get_rank() == 0:
        best = replan(opts, plan, world)
        print(f"autoplan: --elastic: {world} ranks, not {plan.devices}; re-planned: {best.describe()}", flush=True)
        chosen = [best.to_dict()]
    dist.broadcast_object_list(chosen, src=0)
    return Plan.from_dict(chosen[0])


def _train(*, opts: RunOptions, plan, model_file, heartbeat: Heartbeat) -> int:
    from autoplan.execute import rng
    from autoplan.execute.api import parallelize
    from autoplan.execute.materialize import materialize
    from autoplan.execute.mesh import local_device

    torch.manual_seed(opts.seed)
    model = model_file.build()
    torch.manual_seed(opts.seed)  # a meta-built model is initialised here, the same on every rank
    model = materialize(model, device=local_device())
    randomness = rng.dropout_off(model) if opts.verify else None  # before the copy: stochastic depth off in both
    reference = reference_copy(model, model_file) if opts.verify else None
    torch.manual_seed(opts.seed)
    microbatch = model_file.inputs(plan.micro_batch_size)
    target = model_file.target(plan.micro_batch_size)
    trainer = parallelize(model, plan, loss_fn=model_file.loss, microbatch_inputs=microbatch, microbatch_target=target)
    trainer.heartbeat = heartbeat  # the trainer marks its phases (forward mb, gradient sync, optimizer step)
    verifier = _reference(trainer=trainer, model=reference, model_file=model_file) if opts.verify else None
    session = checkpointing.open_session(opts=opts, trainer=trainer)
    rows, stopped, steps_done = session.rows, False, session.start_step
    pp_rank = trainer.mesh.get_local_rank("pp")
    # --verify: dropout off in the run's steps and in its reference, which then compute the same function
    # (rng.py); the batches are drawn outside, so its count of other random draws is the model's own
    model_only = randomness if randomness is not None else contextlib.nullcontext()
    tracer = StepTracer(opts, trainer) if opts.trace else None  # --trace: torch.profiler on the chosen steps
    for step in range(session.start_step, opts.steps):
        heartbeat.mark("batch", step=step)
        checkpointing.maybe_inject_fault(step)
        torch.manual_seed(opts.seed + 1 + step)  # the same global batch on every rank
        inputs, target = model_file.inputs(plan.global_batch_size), model_file.target(plan.global_batch_size)
        rng.seed_step(seed=opts.seed, step=step, pp_rank=pp_rank)
        with model_only:
            traced = tracer.step(step) if tracer else contextlib.nullcontext()
            row = _timed_step(trainer=trainer, step=step, inputs=inputs, target=target, traced=traced)
        rows.append(row)
        steps_done = step + 1
        heartbeat.stepped(row["step_time_s"])  # the deadline applies from the first step's end (compiled, connected)
        if not nonfinite.is_finite(row["loss"]):  # the same all-reduced loss on every rank: all stop here
            return _stop_at_nonfinite(opts=opts, plan=plan, session=session, rows=rows, verified=None)
        # fp16 skips overflowing steps, which leave the weights as they were: not compared
        if verifier is not None and not verifier.done and not trainer.last_step_skipped:
            heartbeat.mark("--verify's reference step", kind="long")
            with model_only:
                verifier.check(
                    trainer=trainer,
                    inputs=_to(inputs, trainer.device),
                    target=_to(target, trainer.device),
                    loss=row["loss"],
                    step=step,
                )
        heartbeat.mark("checkpoint save", kind="long")  # when one is due (or a stop signal came)
        if stopped := session.after_step(trainer, steps_done=steps_done, rows=rows):
            break
    heartbeat.mark("finishing: final checkpoint, audit, outputs", kind="long")
    verified = _verified(verifier, trainer=trainer, randomness=randomness) if verifier is not None else None
    if tracer is not None:
        tracer.write()  # after the timed steps: exporting is no step's time
    session.close(trainer, steps_done=steps_done, rows=rows)
    if stopped:
        if dist.get_rank() == 0:
            write_outputs(opts=opts, plan=plan, rows=rows, verified=verified)
        return EXIT_STOPPED
    audit = _audit(opts=opts, trainer=trainer, plan=plan, model_file=model_file) if opts.audit else None
    if dist.get_rank() == 0:
        write_outputs(opts=opts, plan=plan, rows=rows, verified=verified)
        if audit is not None:
            _write_audit(opts=opts, plan=plan, ranks=audit)
    return EXIT_VERIFY_FAILED if verified is not None and not verified["passed"] else 0


def _stop_at_nonfinite(*, opts: RunOptions, plan, session, rows: list[dict], verified: dict | None) -> int:
    """The first non-finite loss ends the run (autoplan/execute/job/nonfinite.py): no final checkpoint."""
    session.abandon()
    if dist.get_rank() == 0:
        write_outputs(opts=opts, plan=plan, rows=rows, verified=verified, nonfinite=nonfinite.summary_entry(rows[-1]))
    nonfinite.announce(row=rows[-1], precision=plan.precision)
    return EXIT_NONFINITE_LOSS


def _timed_step(*, trainer, step: int, inputs: tuple, target: Any, traced) -> dict[str, Any]:
    x, y = trainer.local_batch(inputs, target)
    _sync(trainer.device)
    start = time.perf_counter()
    with traced:  # torch.profiler, when --trace chose this step (tracing.py)
        loss = trainer.train_step(x, y)
    _sync(trainer.device)
    elapsed_s = time.perf_counter() - start
    trainer.mark("step time and loss all-reduce", kind="collective")
    return {
        "step": step,
        "step_time_s": _max_over_ranks(elapsed_s, trainer.device),
        "loss": trainer.reduce_loss(loss),
        "peak_memory_bytes": int(_max_over_ranks(_peak_memory_bytes(trainer.device), trainer.device)),
    }


def _audit(*, opts: RunOptions, trainer, plan, model_file) -> list[dict] | None:
    """One more step, untimed, under the execution audit's recorders (autoplan/execute/job/audit.py),
    after at least three steps in all (DDP rebuilds its buckets, with a broadcast, in one of the
    first); every rank's record, on rank 0."""
    from autoplan.execute import rng
    from autoplan.execute.job.audit import audit_ranks

    torch.manual_seed(opts.seed + 1 + opts.steps)
    x, y = trainer.local_batch(model_file.inputs(plan.global_batch_size), model_file.target(plan.global_batch_size))
    rng.seed_step(seed=opts.seed, step=opts.steps, pp_rank=trainer.mesh.get_local_rank("pp"))
    for _ in range(max(0, 3 - opts.steps)):
        trainer.train_step(x, y)
    return audit_ranks(trainer, x, y)


def _write_audit(*, opts: RunOptions, plan: Plan, ranks: list[dict]) -> None:
    """audit.csv: the cost model's prediction (written before the ranks started) beside what each rank measured."""
    from autoplan.execute.job.audit import audit_rows
    from autoplan.execute.job.routing_audit import measured_imbalance

    predicted = AuditPrediction.load(opts.out, plan=plan.describe()).stages
    peaks = [stage.peak_bytes for stage in predicted]
    rows = audit_rows(ranks=ranks, predictions=list(predicted), stage_peak_bytes=peaks)
    write_audit(opts.out, rows)
    comm = [r for r in rows if r["what"].startswith("comm")]
    equal = sum(1 for r in comm if r["as_priced"])
    memory = max((abs(r["relative_error"]) for r in rows if r["what"] == "peak live memory"), default=0.0)
    reshards = max((r["measured"] for r in rows if r["what"] == "in-place reshards"), default=0)
    unpriced = f"; {reshards:.0f} in-place reshards no plan prices" if reshards else ""
    imbalance = measured_imbalance(ranks)  # the busiest ep rank's rows over the mean (routing_audit.py)
    routed = f"; routing imbalance {max(imbalance.values()):.2f} measured" if imbalance else ""
    print(
        f"audit: {equal} of {len(comm)} collective rows as priced; peak memory within {100 * memory:.0f}% of the "
        f"prediction{unpriced}{routed}; see {opts.out}/audit.csv",
        flush=True,
    )


def _reference(*, trainer, model, model_file):
    """--verify's reference: ``model`` (the run's model before parallelizing) prepared as the run
    is, which follows the run step by step (autoplan/execute/job/reference.py)."""
    from autoplan.execute.job.reference import Reference

    if trainer.outer is not None and not equals_synchronous(trainer.plan):  # approximate: its invariant instead
        trainer.outer.measure_drift = True
        return ReplicaCheck()
    return Reference(model=model.to(trainer.device), plan=trainer.plan, loss_fn=model_file.loss, policy=trainer.policy)


def _verified(verifier, *, trainer, randomness) -> dict[str, Any]:
    """Print --verify's report (rank 0) and return summary.json's ``verify`` entry."""
    from autoplan.execute import rng
    from autoplan.execute.job.contract import verify_steps
    from autoplan.execute.job.reference import verdict
    from autoplan.execute.job.verify import UPDATED

    said = rng.describe(randomness)
    if isinstance(verifier, ReplicaCheck):
        return _replicas_verified(verifier, plan=trainer.plan)
    passed, report = verdict(checks=verifier.checks, plan=trainer.plan, randomness=said)
    if dist.get_rank() == 0:
        print(report, flush=True)
    diffs = [d for check in verifier.checks for d in check.diffs]
    worst = max((d for d in diffs if not d.name.endswith(UPDATED)), key=lambda d: d.relative, default=None)
    update = max((d for d in diffs if d.name.endswith(UPDATED)), key=lambda d: d.relative, default=None)
    steps = [check.step for check in verifier.checks]
    return {
        "passed": passed,
        "step": steps[0] if steps else None,
        "steps": steps,
        "steps_wanted": verify_steps(trainer.plan),
        "compressed_steps": [check.step for check in verifier.checks if check.compressed],
        "tensors": len(verifier.checks[-1].diffs) if steps else 0,
        "worst": worst.name if worst else None,
        "worst_relative_diff": worst.relative if worst else None,
        "worst_update": update.name if update else None,
        "worst_update_relative_diff": update.relative if update else None,
        "loss_scale": trainer.last_loss_scale,
        "skipped_steps": trainer.scaler.skipped_steps if trainer.scaler else 0,
        "randomness": said,
    }


def _replicas_verified(verifier: ReplicaCheck, *, plan: Plan) -> dict[str, Any]:
    """Print the replica check's report (rank 0); summary.json's ``verify`` entry (execute/job/replicas.py)."""
    passed, report = replicas.verdict(checks=verifier.checks, plan=plan)
    if dist.get_rank() == 0:
        print(report, flush=True)
    spread = max((c.spread_after for c in verifier.checks), default=None)
    steps = [c.step for c in verifier.checks]
    return {"passed": passed, "approximate": True, "steps": steps, "replica_spread_after_sync": spread}


def _to(obj: Any, device: torch.device) -> Any:
    from autoplan.execute.batch import move_to

    return move_to(obj, device)


def _error_file() -> Path | None:
    folder = os.environ.get("AUTOPLAN_ERROR_DIR")
    return Path(folder) / f"rank{os.environ.get('RANK', '0')}.txt" if folder else None


def main(opts: RunOptions, *, replan: Replan | None = None) -> int:
    """One rank, in a launched process or under torchrun; records a failure for the launcher to name."""
    from autoplan.jobs.lifeline import die_with_launcher
    from autoplan.quiet import silence_known_noise

    die_with_launcher()
    silence_known_noise()  # before the model file imports its libraries (autoplan/quiet.py)
    try:
        return run_rank(opts, replan=replan)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        record_failure(exc)
        if isinstance(exc, AutoplanError) and _error_file() is not None and os.environ.get(DEBUG_ENV) != "1":
            return 1  # a refusal: the launcher says it in one line; `autoplan --debug run` shows the traceback
        raise


def record_failure(exc: BaseException, *, precision: str = "fp32") -> None:
    """The exception's first line, and what it most likely means (execute/job/failure_hints.py), for the launcher."""
    path = _error_file()
    if path is not None and not getattr(exc, "_autoplan_recorded", False):  # run_rank's, with the plan's precision
        first = (str(exc).strip().splitlines() or [""])[0]
        write_text_atomic(path, f"{type(exc).__name__}: {first}{failure_hint(first, precision=precision)}\n")
        with contextlib.suppress(AttributeError, TypeError):
            exc._autoplan_recorded = True  # type: ignore[attr-defined]


def exit_now(code: int) -> None:
    """Leave without interpreter finalisation once the rank's work is done: its files are written
    atomically and its process group destroyed, but gloo's worker threads can still hold
    completed-work objects whose tensors, freed while the interpreter is torn down, take the GIL
    and abort the process ("terminate called without an active exception", seen once in CI on a
    rank that had finished). Flushing and ``os._exit`` skip that teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
