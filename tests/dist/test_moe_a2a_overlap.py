"""DualPipeV's F&B pairs with the EP all-to-all overlapped (autoplan/execute/overlap_f_b.py), on 4 gloo ranks
(pp 2, dp 2, ep 2, examples/moe.py with 4 MoE blocks), beside the same plan run plainly in the same process group:
a plan built here without recomputation, and the plan ``autoplan plan --fix schedule=dualpipev,ep=2,
recompute=selective,moe_a2a_overlap=on`` returns (the planner offers the overlap beside selective recomputation;
the backward half re-runs its blocks beside the forward half, their all-to-alls' outputs kept: none sent again).

All four runs follow --verify's unsharded reference (autoplan/execute/job/reference.py) for two steps; the overlapped
one ran every OVERLAP_F_B action of the rank's order through the overlap function; the execution audit sees the same
all-to-alls (each half's on its own lane is still the ep group's) and the same other collectives as the plain run
of its recompute mode, and the overlapped run's peak no higher than the plain run's (5% for the forward's
transients) and, with and without recomputation, within the 10% the MoE audits hold (tests/dist/test_expert_parallel.py)
of the price, which replays each pair as its forward then its backward (docs/executor.md, "EP all-to-all overlap";
selective recomputation's since its re-runs hold one block's and that block is priced: "Selective recomputation
against its price"). The ratios are printed, as are step times without recomputation, measured alternately, never
asserted."""

from __future__ import annotations

import copy
import os
import resource
import time
from dataclasses import replace
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
#: (overlap, recompute) of the four runs; the first two are timed
RUNS = ((False, "none"), (True, "none"), (False, "selective"), (True, "selective"))
#: the pins of the selective runs' plan (module docstring), and its global batch: 2 dp ranks x 8 samples
SELECTIVE_PINS, BATCH = "schedule=dualpipev,ep=2,recompute=selective,moe_a2a_overlap=on", 16


def _plan(overlap: bool, recompute: str, profile: str) -> Plan:
    return Plan(
        devices=4, dp=2, tp=1, pp=2, ep=2, micro_batch_size=2, num_microbatches=4, schedule="dualpipev",
        virtual_stages=2, stages=[[f"layers.{i}"] for i in range(4)], routing=RoutingModel(), zero_stage=1,
        moe_a2a_overlap=overlap, recompute=recompute, profile=profile,
    )  # fmt: skip


def _planned(profile: str) -> Plan:
    """The plan the planner returns under SELECTIVE_PINS on 4 devices (module docstring)."""
    from autoplan.solve.api import plan_graph
    from autoplan.trace import trace_model_file

    graph = trace_model_file(ROOT / "examples" / "moe.py", BATCH)
    return plan_graph(graph, devices=4, profile=profile, batch_size=BATCH, fix=SELECTIVE_PINS).best


def _plans(planned: dict, profile: str) -> dict:
    """The four runs' plans: built without recomputation, the planner's (and its plain twin) with it."""
    plan = Plan.from_dict(planned)
    selective = {(False, "selective"): replace(plan, moe_a2a_overlap=False), (True, "selective"): plan}
    return {key: selective.get(key) or _plan(*key, profile) for key in RUNS}


def _worker(rank, world, port, profile, planned, messages):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the two runs alternate on one core per rank
    report(messages, rank, lambda: _both(rank, world, profile, planned))


def _both(rank: int, world: int, profile: str, planned: dict) -> dict:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    runs = {key: _Run(plan) for key, plan in _plans(planned, profile).items()}
    for step in range(2):  # --verify's steps
        for run in runs.values():
            run.verified_step(step)
    for step in range(2, 2 + TIMED_STEPS):  # alternately, so both see the same machine
        for key in RUNS[:2]:
            runs[key].timed_step(step)
    return {key: run.result() for key, run in runs.items()}


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
        inputs = self.file.inputs(plan.micro_batch_size)
        self.trainer = parallelize(model, plan, loss_fn=self.file.loss, microbatch_inputs=inputs)
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


def _priced_peaks(plan: Plan, profile: str) -> list[float]:
    from autoplan.cost import CostModel
    from autoplan.profile import load_profile
    from autoplan.trace import trace_model_file

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
    planned = _planned(str(profile))
    assert (planned.schedule, planned.pp, planned.ep, planned.recompute) == ("dualpipev", 2, 2, "selective")
    assert planned.moe_a2a_overlap and planned.tp == 1 and planned.zero_stage <= 1
    plans = _plans(planned.to_dict(), str(profile))
    args = (str(profile), planned.to_dict())
    values = spawn_ranks(_worker, processes=4, args=args, timeout_s=300, what="overlapping")
    for recompute in ("none", "selective"):
        orders = v_order("dualpipev", pp=2, m=plans[(True, recompute)].num_microbatches)
        plain, overlapped = values[0][(False, recompute)], values[0][(True, recompute)]
        assert plain["passed"] and overlapped["passed"], plain["said"] + overlapped["said"]
        for rank in range(4):  # ranks 0, 1 on pipeline rank 0; 2, 3 on 1 (the mesh's (pp, dp) order)
            pairs = sum(action[0] == "FB" for action in orders[rank // 2])
            steps = 2 + (TIMED_STEPS if recompute == "none" else 0) + 1  # verified, timed, audited
            ran = values[rank][(True, recompute)]["pairs"], values[rank][(False, recompute)]["pairs"]
            assert pairs > 0 and ran == (steps * pairs, 0), (recompute, rank, ran)
        peaks = _priced_peaks(plans[(True, recompute)], str(profile))
        assert len(peaks) == 2
        for a, b in zip(plain["audit"], overlapped["audit"]):
            # the same collectives: under recomputation, a re-run block in either half sends none again
            assert a["comm"] == b["comm"] and any(tuple(row[:2]) == ("ep", "all_to_all") for row in b["comm"]), (a, b)
            # the pair's halves hold both micro-batches' working sets at once, yet no more than the forward-then-
            # backward order the price replays (its forward's activations all made before the backward frees any), up
            # to the forward's transients; and the price covers the pair within the MoE audits' band
            assert b["peak_live_bytes"] <= 1.05 * a["peak_live_bytes"], (a["peak_live_bytes"], b["peak_live_bytes"])
            assert abs(b["peak_live_bytes"] / peaks[b["stage"]] - 1) <= 0.10, (recompute, b["peak_live_bytes"], peaks)
            print(f"{recompute} stage {b['stage']}: peak / price plain {a['peak_live_bytes'] / peaks[a['stage']]:.3f} "
                  f"overlapped {b['peak_live_bytes'] / peaks[b['stage']]:.3f}")  # fmt: skip
        for rank, value in sorted(values.items()):
            peaks = plain["audit"][rank]["peak_live_bytes"], overlapped["audit"][rank]["peak_live_bytes"]
            print(f"{recompute}: peak bytes plain {peaks[0]} overlapped {peaks[1]}", end="; ")
            plain_s, overlapped_s = value[(False, recompute)], value[(True, recompute)]
            print(f"rank {rank}: wall s plain {plain_s['wall_s']} overlapped {overlapped_s['wall_s']}; user s "
                  f"plain {plain_s['user_s']} overlapped {overlapped_s['user_s']}")  # fmt: skip
