"""DualPipeV's F&B pairs with the EP all-to-all overlapped (autoplan/execute/overlap_f_b.py), on 4 gloo ranks
(pp 2, dp 2, ep 2, examples/moe.py with 4 MoE blocks), beside the same plan run plainly in the same process group.

Both runs follow --verify's unsharded reference (autoplan/execute/job/reference.py) for two steps; the overlapped
one ran every OVERLAP_F_B action of the rank's order through the overlap function; the execution audit sees the same
all-to-alls (each half's on its own lane is still the ep group's) and the same other collectives in both runs, and
the overlapped run's peak no higher than the plain run's (5% for the forward's transients) and within the 10% the
MoE audits hold (tests/dist/test_expert_parallel.py) of the price, which replays each pair as its forward then its
backward (docs/executor.md, "EP all-to-all overlap"). Step times are printed, measured alternately, never asserted."""

from __future__ import annotations

import copy
import os
import resource
import time
from pathlib import Path

import pytest
import torch

from autoplan.jobs.spawn import report, spawn_ranks
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SIZES = dict(LAYERS=4, DIM=64, HEADS=4, EXPERTS=4, VOCAB=512, SEQ=32)
TIMED_STEPS = 3


def _plan(overlap: bool, profile: str) -> Plan:
    return Plan(
        devices=4, dp=2, tp=1, pp=2, ep=2, micro_batch_size=2, num_microbatches=4, schedule="dualpipev",
        virtual_stages=2, stages=[[f"layers.{i}"] for i in range(4)], routing=RoutingModel(), zero_stage=1,
        moe_a2a_overlap=overlap, profile=profile,
    )  # fmt: skip


def _worker(rank, world, port, profile, messages):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the two runs alternate on one core per rank
    report(messages, rank, lambda: _both(rank, world, profile))


def _both(rank: int, world: int, profile: str) -> dict:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    runs = {overlap: _Run(_plan(overlap, profile)) for overlap in (False, True)}
    for step in range(2):  # --verify's steps
        for run in runs.values():
            run.verified_step(step)
    for step in range(2, 2 + TIMED_STEPS):  # alternately, so both see the same machine
        for run in runs.values():
            run.timed_step(step)
    return {overlap: run.result() for overlap, run in runs.items()}


class _Run:
    """One plan's trainer and reference, as ``autoplan run --verify --audit`` drives them (execute/job/runner.py)."""

    def __init__(self, plan: Plan):
        from autoplan.execute.api import parallelize
        from autoplan.execute.job.reference import Reference
        from autoplan.execute.materialize import materialize
        from autoplan.modelfile import load_model_file

        self.plan, self.file = plan, load_model_file(ROOT / "examples" / "moe.py")
        torch.manual_seed(0)
        model = materialize(self.file.build(), device=torch.device("cpu"))
        reference = copy.deepcopy(model)
        self.trainer = parallelize(model, plan, loss_fn=self.file.loss, microbatch_inputs=self.file.inputs(2))
        self.reference = Reference(model=reference, plan=plan, loss_fn=self.file.loss, policy=self.trainer.policy)
        self.wall_s, self.user_s = [], []

    def _batch(self, step: int):
        torch.manual_seed(1 + step)  # the same global batch on every rank
        return self.file.inputs(self.plan.global_batch_size), self.file.target(self.plan.global_batch_size)

    def verified_step(self, step: int) -> None:
        inputs, target = self._batch(step)
        loss = self.trainer.reduce_loss(self.trainer.train_step(*self.trainer.local_batch(inputs, target)))
        self.reference.check(trainer=self.trainer, inputs=inputs, target=target, loss=loss, step=step)

    def timed_step(self, step: int) -> None:
        x, y = self.trainer.local_batch(*self._batch(step))
        torch.distributed.barrier()
        user, wall = resource.getrusage(resource.RUSAGE_SELF).ru_utime, time.perf_counter()
        self.trainer.train_step(x, y)
        self.wall_s.append(time.perf_counter() - wall)
        self.user_s.append(resource.getrusage(resource.RUSAGE_SELF).ru_utime - user)

    def result(self) -> dict:
        from autoplan.execute.job.audit import audit_ranks
        from autoplan.execute.job.reference import verdict

        passed, said = verdict(checks=self.reference.checks, plan=self.plan, randomness="no dropout")
        audit = audit_ranks(self.trainer, *self.trainer.local_batch(*self._batch(9)))
        pairs = getattr(getattr(self.trainer.schedule, "overlapped", None), "pairs", 0)
        return dict(passed=passed, said=said, pairs=pairs, audit=audit, wall_s=self.wall_s, user_s=self.user_s)


def _priced_peaks(profile: str) -> list[float]:
    from autoplan.cost import CostModel
    from autoplan.profile import load_profile
    from autoplan.trace import trace_model_file

    plan = _plan(True, profile)
    model = CostModel(trace_model_file(ROOT / "examples" / "moe.py", 2, routing=plan.routing), load_profile(profile))
    stages, _, _ = model.priced_stages(plan)
    return [memory.peak_bytes for memory in model.stage_memory(plan, stages)]


def test_dualpipevs_pairs_run_overlapped_compute_the_plain_runs_step_and_audit_as_priced(tmp_path, monkeypatch):
    from autoplan.cost import v_order

    for name, value in SIZES.items():
        monkeypatch.setenv(f"AUTOPLAN_MOE_{name}", str(value))  # examples/moe.py reads its sizes when loaded
    profile = tmp_path / "cpu4.yaml"  # cpu-gloo with the 4 ranks on one node
    profile.write_text(
        (ROOT / "profiles/cpu-gloo.yaml").read_text().replace("devices_per_node: 2", "devices_per_node: 4")
    )
    values = spawn_ranks(_worker, processes=4, args=(str(profile),), timeout_s=300, what="overlapping")
    plain, overlapped = values[0][False], values[0][True]
    assert plain["passed"] and overlapped["passed"], plain["said"] + overlapped["said"]
    orders = v_order("dualpipev", pp=2, m=4)
    for rank in range(4):  # ranks 0, 1 on pipeline rank 0; 2, 3 on 1 (the mesh's (pp, dp) order)
        pairs = sum(action[0] == "FB" for action in orders[rank // 2])
        steps = 2 + TIMED_STEPS + 1  # verified, timed, audited
        assert pairs > 0 and values[rank][True]["pairs"] == steps * pairs and values[rank][False]["pairs"] == 0
    peaks = _priced_peaks(str(profile))
    assert len(peaks) == 2
    for a, b in zip(plain["audit"], overlapped["audit"]):
        assert a["comm"] == b["comm"] and any(tuple(row[:2]) == ("ep", "all_to_all") for row in b["comm"]), (a, b)
        # the pair's halves hold both micro-batches' working sets at once, yet no more than the forward-then-backward
        # order the price replays (its forward's activations all made before the backward frees any), up to the
        # forward's transients; and the price covers the pair within the MoE audits' band
        assert b["peak_live_bytes"] <= 1.05 * a["peak_live_bytes"], (a["peak_live_bytes"], b["peak_live_bytes"])
        assert abs(b["peak_live_bytes"] / peaks[b["stage"]] - 1) <= 0.10, (b["peak_live_bytes"], peaks)
    for rank, value in sorted(values.items()):
        peaks = plain["audit"][rank]["peak_live_bytes"], overlapped["audit"][rank]["peak_live_bytes"]
        print(f"peak bytes plain {peaks[0]} overlapped {peaks[1]}", end="; ")
        print(f"rank {rank}: wall s plain {value[False]['wall_s']} overlapped {value[True]['wall_s']}; user s "
              f"plain {value[False]['user_s']} overlapped {value[True]['user_s']}")  # fmt: skip
