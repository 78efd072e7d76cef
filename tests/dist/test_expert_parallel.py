"""Expert parallelism on real gloo groups, against the unsharded model.

The dispatch alone (autoplan/execute/expert_dispatch.py) on two ranks gives the unsharded experts
module's output and the gradients of its input, routing weights and (summed over the ranks'
losses) expert weights, also when a rank receives no rows. Then `autoplan run --verify` on
examples/moe.py (plain torch) and examples/hf_mixtral.py (transformers) with ep=2 at dp=2, dp=4
(ZeRO-1 and ZeRO-3: experts reduced over their edp pair) and under a pipeline (pp=2), and the
execution audit attributes the token exchange to dim ep and the experts' gradient reductions to edp.
The planner's own ep=2 plan runs through the CLI as a user types it; every other run is its ranks' code on one
shared 2-rank or 4-rank group (the ``jobs`` fixture), the dispatch's group last."""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from exec_harness import _spawn

from autoplan.jobs.spawn import report, spawn_ranks
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan
from autoplan.types.run_options import RunOptions

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SIZES = {
    "moe": ("AUTOPLAN_MOE", dict(LAYERS=2, DIM=64, HEADS=4, EXPERTS=4, VOCAB=512, SEQ=32)),
    "hf_mixtral": ("AUTOPLAN_HF_MIXTRAL", dict(LAYERS=2, DIM=64, HEADS=4, FFN=128, EXPERTS=4, VOCAB=512, SEQ=32)),
}
A2A_PER_LAYER_AND_MICROBATCH = 5  # counts, dispatch and combine forward; their gradients backward


# ---- the dispatch alone -----------------------------------------------------------------------
def _experts(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "moe":
        spec = importlib.util.spec_from_file_location("moe_example", ROOT / "examples" / "moe.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.Experts(num_experts=4, dim=16, hidden=24)
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    config = MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=4)
    config._experts_implementation = kind.split(":")[1]
    experts = MixtralExperts(config)
    for weight in experts.parameters():
        torch.nn.init.normal_(weight, std=0.2)
    return experts


def _dispatch_case(rank: int, world: int, kind: str, skewed: bool) -> None:
    """Rank r holds tokens [r S, (r+1) S) and experts [2r, 2r+2); its loss weights its outputs
    by a fixed pattern, so the reference back-propagates the sum of both ranks' losses."""
    from autoplan.execute.expert_dispatch import ExpertsDispatch

    full, tokens, k, local = _experts(kind), 12, 2, 2
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(world * tokens, 16, generator=g, requires_grad=True)
    index = torch.stack([torch.randperm(4, generator=g)[:k] for _ in range(world * tokens)])
    if skewed:  # every pair goes to rank 0's experts: rank 1 receives no rows at all
        index = torch.tensor([[0, 1]] * (world * tokens))
    weights = torch.rand(world * tokens, k, generator=g, requires_grad=True)
    pattern = torch.linspace(-1, 1, world * tokens * 16).view(world * tokens, 16)
    (full(hidden, index, weights) * pattern).sum().backward()
    reference = full(hidden, index, weights).detach()

    dispatch = ExpertsDispatch(fqn="experts", module=full)
    dispatch.shard(group=torch.distributed.group.WORLD)
    mine = slice(rank * tokens, (rank + 1) * tokens)
    params = {
        n: torch.nn.Parameter(p.detach()[rank * local : (rank + 1) * local].clone()) for n, p in full.named_parameters()
    }
    h, w = (t.detach()[mine].clone().requires_grad_() for t in (hidden, weights))
    out = dispatch(h, index[mine], w, [params[n] for n in dispatch.names])
    (out * pattern[mine]).sum().backward()
    torch.testing.assert_close(out, reference[mine])
    torch.testing.assert_close(h.grad, hidden.grad[mine])
    torch.testing.assert_close(w.grad, weights.grad[mine])
    for name, param in params.items():
        torch.testing.assert_close(param.grad, full.get_parameter(name).grad[rank * local : (rank + 1) * local])


def _dispatch_worker(rank, world, port, cases, messages):
    report(messages, rank, lambda: _dispatch_cases(rank, world, port, cases))


def _dispatch_cases(rank, world, port, cases):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    for kind, skewed in cases:
        _dispatch_case(rank, world, kind, skewed)
    return "ok"


# ---- autoplan run --verify --------------------------------------------------------------------
def _plan(model: str, **kw) -> Plan:
    if "stages" not in kw and kw.get("pp", 1) > 1:
        prefix = "model.layers" if model.startswith("hf_") else "layers"
        kw["stages"] = [[f"{prefix}.0"], [f"{prefix}.1"]]
    kw.setdefault("pp", 1)
    return Plan(devices=kw["dp"] * kw["pp"], tp=1, micro_batch_size=2, num_microbatches=2, routing=RoutingModel(), **kw)


#: examples/moe.py's attention split over tp (its experts replicated: ep = 1)
SPLIT = {f"layers.{i}.{name}": kind for i in range(2) for name, kind in (("qkv", "colwise"), ("proj", "rowwise"))}
FOLDED = dict(tp=2, pp=1, ep=2, micro_batch_size=2, sequence_parallel=True, routing=RoutingModel())
EXPERT_TP = dict(
    devices=2,
    dp=1,
    tp=2,
    pp=1,
    expert_tp=2,
    micro_batch_size=2,
    num_microbatches=2,
    sequence_parallel=True,
    routing=RoutingModel(),
    stages=[["model.layers.0", "model.layers.1"]],
)
#: the runs the tests below read: name -> (example, plan, --audit)
JOBS = {
    "ep2-dp2-moe": ("moe", _plan("moe", dp=2, ep=2), False),
    "ep2-dp2-hf_mixtral": ("hf_mixtral", _plan("hf_mixtral", dp=2, ep=2), False),
    "recompute-selective": ("moe", _plan("moe", dp=2, ep=2, recompute="selective"), True),
    "recompute-full": ("moe", _plan("moe", dp=2, ep=2, recompute="full"), True),
    # priced on a profile with 4 devices (volumes do not depend on the link)
    "ep2-dp4-moe": ("moe", _plan("moe", dp=4, ep=2, zero_stage=3, profile="dgx-a100"), True),
    "ep2-dp4-hf_mixtral": ("hf_mixtral", _plan("hf_mixtral", dp=4, ep=2, zero_stage=1, profile=""), False),
    "ep2-pp2-moe": ("moe", _plan("moe", dp=2, ep=2, pp=2, zero_stage=1), False),
    "ep2-pp2-hf_mixtral": ("hf_mixtral", _plan("hf_mixtral", dp=2, ep=2, pp=2, zero_stage=0), False),
    "tp2-moe": ("moe", Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=2, num_microbatches=2, tp_plan=SPLIT), False),
    "folded": ("moe", Plan(devices=2, dp=1, num_microbatches=2, **FOLDED), True),
    "folded-dp2": ("moe", Plan(devices=4, dp=2, num_microbatches=1, **FOLDED), False),
    "expert-tp": ("hf_mixtral", Plan(**EXPERT_TP), True),
    "expert-tp-selective": ("hf_mixtral", Plan(**EXPERT_TP, recompute="selective"), True),
}


def _options(model: str, out: Path, audit: bool) -> RunOptions:
    """``autoplan run examples/MODEL.py --plan OUT/plan.json --steps 2 --verify [--audit] --out OUT``; its
    heartbeat only records (--hang-timeout-s 0): no launcher watches these ranks."""
    return RunOptions(model=str(ROOT / "examples" / f"{model}.py"), plan=str(out / "plan.json"), steps=2,
                      out=str(out), verify=True, audit=audit, hang_timeout_s=0)  # fmt: skip


def _job(model: str, plan: Plan, *, out: str, audit: bool) -> dict:
    """What every rank of that `autoplan run` runs once its process group is up (autoplan/execute/job/runner.py),
    here on the case group's: its exit code and, on rank 0, the summary.json it wrote."""
    import torch.distributed as dist

    from autoplan.execute.job import runner
    from autoplan.execute.job.heartbeats import start_heartbeat
    from autoplan.modelfile import load_model_file

    opts = _options(model, Path(out), audit)
    heartbeat = start_heartbeat(opts, plan)
    try:
        code = runner._train(opts=opts, plan=plan, model_file=load_model_file(opts.model), heartbeat=heartbeat)
    finally:
        heartbeat.stop()
    summary = json.loads((Path(out) / "summary.json").read_text()) if dist.get_rank() == 0 else None
    return {"code": code, "summary": summary}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    """Every run of :data:`JOBS` on one forked 2-rank and one 4-rank gloo group (tests/dist/exec_harness.py), where
    each `autoplan run` started an interpreter that imported torch and the example, then its ranks: the same rank
    code, the audit's prediction written first as `autoplan run --audit` writes it (autoplan/cli/rank.py). Each
    run's folder by name, once its ranks all finished, it exited 0 and its verify PASSED."""
    from autoplan.cli.rank import write_audit_prediction

    root, groups, models = tmp_path_factory.mktemp("ep_runs"), {2: [], 4: []}, {"moe"}
    with contextlib.suppress(ImportError):
        import transformers  # noqa: F401

        models.add("hf_mixtral")
    sizes = {f"{prefix}_{k}": str(v) for prefix, values in SIZES.values() for k, v in values.items()}
    with mock.patch.dict(os.environ, sizes):  # the examples read their sizes when loaded, here and in the ranks
        for name, (model, plan, audit) in JOBS.items():
            if model in models:
                out = root / name
                out.mkdir()
                plan.save(out / "plan.json")
                if audit:
                    write_audit_prediction(_options(model, out, audit), plan)
                groups[plan.devices].append((name, model, plan, functools.partial(_job, out=str(out), audit=audit)))
        results = {**_spawn(2, groups[2]), **_spawn(4, groups[4])}
    return {name: (root / name, result) for name, result in results.items()}


def _ran(jobs: dict, name: str) -> Path:
    """The folder of run ``name``, which exited 0 with its verify PASSED on every rank."""
    if JOBS[name][0].startswith("hf_"):
        pytest.importorskip("transformers")
    errors = {k: v["error"] for k, (_, v) in jobs.items() if k.split(" (rank ")[0] == name and "error" in v}
    assert not errors, "\n".join(f"{k}:\n{v}" for k, v in errors.items())
    folder, result = jobs[name]
    assert result["code"] == 0 and result["summary"]["verify"]["passed"], result
    return folder


def _run(tmp_path: Path, model: str, plan: Path, *extra: str) -> subprocess.CompletedProcess:
    prefix, sizes = SIZES[model]
    env = {**os.environ, **{f"{prefix}_{k}": str(v) for k, v in sizes.items()}}
    command = [sys.executable, "-m", "autoplan.cli", "run", str(ROOT / "examples" / f"{model}.py"), "--plan", str(plan),
               "--steps", "2", "--verify", "--out", str(tmp_path / "run"), *extra]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
    return result


def _rows(folder: Path) -> list[dict]:
    with open(folder / "audit.csv") as f:
        return list(csv.DictReader(f))


def _audit(folder: Path) -> dict[tuple[int, str], tuple[int, float]]:
    return {
        (int(r["rank"]), r["what"][len("comm ") :]): (int(float(r["measured_count"])), float(r["measured"]))
        for r in _rows(folder)
        if r["what"].startswith("comm ")
    }


def test_moe_example_planned_with_ep2_verifies_and_audits_the_all_to_all_on_ep(tmp_path, monkeypatch):
    """The planner's plan with ep pinned to 2 (DDP), run with `autoplan run --verify --audit` as a user types it:
    every rank issues 5 all-to-alls per MoE layer and micro-batch on the ep group (here also the dp ranks)."""
    from autoplan.solve.api import plan_graph
    from autoplan.trace import trace_model_file

    prefix, sizes = SIZES["moe"]
    for name, value in sizes.items():
        monkeypatch.setenv(f"{prefix}_{name}", str(value))  # the model file reads its sizes when loaded
    graph = trace_model_file(ROOT / "examples" / "moe.py", 8)
    plan = plan_graph(
        graph, devices=2, profile="cpu-gloo", fix="ep=2,zero=0,precision=bf16,pp=1"
    ).best  # the 16-bit tolerance (verify.py)
    assert (plan.dp, plan.ep, plan.routing) == (2, 2, graph.moe_layers[0].routing)
    _run(tmp_path, "moe", plan.save(tmp_path / "plan.json"), "--audit")
    comm = _audit(tmp_path / "run")
    for rank in (0, 1):
        count, size = comm[(rank, "ep all_to_all")]
        assert count == sizes["LAYERS"] * plan.num_microbatches * A2A_PER_LAYER_AND_MICROBATCH and size > 0
        assert (rank, "dp all_reduce") in comm  # DDP still reduces the dense gradients
    rows = [r for r in _rows(tmp_path / "run") if r["what"].startswith("comm ")]
    for row in rows:  # priced = executed: every collective as priced, the all-to-all's bytes up to the routing
        if row["what"] == "comm ep all_to_all":
            assert row["measured_count"] == row["predicted_count"]
            assert abs(float(row["relative_error"])) < 0.1
        else:
            assert row["as_priced"] == "True", row


@pytest.mark.parametrize("recompute, a2a", [("selective", A2A_PER_LAYER_AND_MICROBATCH), ("full", 8)])
def test_selective_recompute_reruns_the_experts_but_not_their_all_to_alls(jobs, recompute, a2a):
    """ep=2 at dp=2 under recomputation, run with --verify and --audit: selective re-runs the blocks' computation
    and keeps the all-to-alls' outputs (types/saved_ops.py), so each MoE layer sends its 5 all-to-alls per
    micro-batch as without recomputation, full re-sends the forward's 3; the counts and the peak as priced."""
    folder = _ran(jobs, f"recompute-{recompute}")
    rows, comm = _rows(folder), _audit(folder)
    for rank in (0, 1):
        assert comm[(rank, "ep all_to_all")][0] == SIZES["moe"][1]["LAYERS"] * 2 * a2a  # 2 micro-batches
    a2a_rows = [r for r in rows if r["what"] == "comm ep all_to_all"]
    assert len(a2a_rows) == 2 and all(r["measured_count"] == r["predicted_count"] for r in a2a_rows)
    peaks = [abs(float(r["relative_error"])) for r in rows if r["what"] == "peak live memory"]
    assert len(peaks) == 2 and max(peaks) <= 0.10, peaks


@pytest.mark.parametrize("model", ["moe", "hf_mixtral"])
def test_ep2_at_dp2_verifies(jobs, model):
    _ran(jobs, f"ep2-dp2-{model}")


@pytest.mark.parametrize("model, zero", [("moe", 3), ("hf_mixtral", 1)])
def test_ep2_at_dp4_reduces_experts_over_edp_and_verifies(jobs, model, zero):
    folder = _ran(jobs, f"ep2-dp4-{model}")
    assert JOBS[f"ep2-dp4-{model}"][1].zero_stage == zero
    if zero == 3:  # FSDP2 shards and reduces each expert over the two ranks that hold it
        comm = _audit(folder)
        assert all((rank, "edp reduce_scatter") in comm and (rank, "ep all_to_all") in comm for rank in range(4))


@pytest.mark.parametrize("model, zero", [("moe", 1), ("hf_mixtral", 0)])
def test_ep2_under_a_pipeline_verifies(jobs, model, zero):
    _ran(jobs, f"ep2-pp2-{model}")
    assert JOBS[f"ep2-pp2-{model}"][1].zero_stage == zero


def test_moe_example_under_tensor_parallelism_runs_its_experts_replicated(jobs):
    """At tp > 1 (ep = 1) DTensor cannot run an experts forward's data-dependent ops; the experts
    run replicated on local tensors while attention is split."""
    _ran(jobs, "tp2-moe")


def test_ep2_folded_over_tp2_verifies_and_audits_as_priced(jobs):
    """MoE Parallel Folding at tp=2, ep=2 with SP on 2 ranks (the ep group is the tp group): each rank
    routes its own sequence shard to the experts, the run matches the unsharded model, every tp
    collective is as priced (the experts' gradients no longer all-reduced over tp), the all-to-alls on
    ep are as many as priced and their bytes, summed over the ranks, exact, and the peak within 10%."""
    rows = _rows(_ran(jobs, "folded"))
    a2a = [r for r in rows if r["what"] == "comm ep all_to_all"]
    assert len(a2a) == 2 and all(r["measured_count"] == r["predicted_count"] for r in a2a)
    assert sum(float(r["measured"]) for r in a2a) == sum(float(r["predicted"]) for r in a2a)
    assert all(r["as_priced"] == "True" for r in rows if r["what"].startswith("comm tp "))
    peaks = [r for r in rows if r["what"] == "peak live memory"]
    assert peaks and all(abs(float(r["relative_error"])) < 0.1 for r in peaks)


def test_ep2_folded_over_tp2_at_dp2_reduces_experts_over_edp_and_verifies(jobs):
    """4 ranks, dp=2 x tp=2 with ep=2 folded over each dp replica's tp ranks: the experts' gradients are
    summed over their edp pair (ranks 0 and 2, 1 and 3) and divided by dp, the dense ones all-reduced over dp."""
    _ran(jobs, "folded-dp2")


def test_expert_tp2_over_tp2_verifies_and_audits_as_priced(jobs):
    """Hugging Face Mixtral (a fused gate_up_proj, split in its two halves) at tp = expert_tp = 2 with SP through
    `autoplan run --verify --audit` (execute/expert_tp.py): each rank's routed rows gathered over etp around its
    half of every expert's FFN and the partial outputs reduce-scattered; the run matches the unsharded model, every
    collective (the etp all-to-alls, the tp ones) and the matmul FLOPs are as priced, the peak within 10%."""
    rows = _rows(_ran(jobs, "expert-tp"))
    comm = [r for r in rows if r["what"].startswith("comm ")]
    assert {r["what"] for r in comm} >= {"comm etp all_to_all", "comm tp all_gather"}
    assert all(r["as_priced"] == "True" for r in comm), [r for r in comm if r["as_priced"] != "True"]
    flops = [r for r in rows if "matmul FLOPs" in r["what"]]
    assert len(flops) == 4 and all(r["as_priced"] == "True" for r in flops), flops
    peaks = [abs(float(r["relative_error"])) for r in rows if r["what"] == "peak live memory"]
    assert len(peaks) == 2 and max(peaks) <= 0.10, peaks


def test_expert_tp2_under_selective_recompute_keeps_its_etp_all_to_alls(jobs):
    """The same Mixtral at tp = expert_tp = 2 with selective recomputation: the blocks' computation re-runs but
    the etp group's all-to-alls (counts, gathered rows, scattered outputs) are kept, not sent again, so every
    collective is as priced (types/saved_ops.py), and the kept gathered rows put the peak within 10%."""
    rows = _rows(_ran(jobs, "expert-tp-selective"))
    comm = [r for r in rows if r["what"].startswith("comm ")]
    etp = [r for r in comm if r["what"] == "comm etp all_to_all"]
    assert etp and all(r["measured_count"] == r["predicted_count"] for r in etp), etp
    assert all(r["as_priced"] == "True" for r in comm), [r for r in comm if r["as_priced"] != "True"]
    peaks = [abs(float(r["relative_error"])) for r in rows if r["what"] == "peak live memory"]
    assert len(peaks) == 2 and max(peaks) <= 0.10, peaks


# ---- the dispatch alone, on two ranks --------------------------------------------------------
def test_the_dispatch_on_two_ranks_is_the_unsharded_experts_module():
    """Output, input, routing-weight and expert-weight gradients, for examples/moe.py's experts and
    Hugging Face Mixtral's (its eager loop and its grouped GEMM), with random and one-sided routing. Last in the
    module: its ranks fork from the fork server the runs' groups started (exec_harness.PRELOAD: the executor
    imported once), where a first spawn_ranks would start it with torch alone and every rank of those groups
    imported the executor again (this module alone; in the whole suite test_audit.py starts it first)."""
    cases = [("moe", False), ("moe", True)]
    try:
        import transformers  # noqa: F401

        cases += [("mixtral:eager", False), ("mixtral:grouped_mm", True)]
    except ImportError:
        pass
    assert spawn_ranks(_dispatch_worker, processes=2, args=(cases,), timeout_s=120, what="dispatching") == {
        0: "ok",
        1: "ok",
    }
