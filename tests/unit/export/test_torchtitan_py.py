"""torchtitan 0.3 export (the default format): each exported config function is started by
torchtitan's own start-up path, as far as a CPU allows, in one subprocess (STARTUP):

``ConfigManager().parse_args(["--module", FILE, "--config", "autoplan_plan", ...])`` (tyro and
``Trainer.Config``'s checks), torchtitan's ``init_distributed`` in its dry-run mode
(``--comm.mode fake_backend``: a fake process group of the plan's world size), ``ParallelDims``,
the model of the matched flavour built on the meta device by its ``ModelSpec``, and the
``ModelSpec``'s own ``pipelining_fn`` / ``parallelize_fn`` (pipeline split and schedule, TP, AC,
compile wrappers, FSDP) on that meta model. Two departures, both forced by the CPU: meshes are
built for ``cpu`` (torchtitan's device_type falls back to cuda), and ``--parallelism.spmd_backend
full_dtensor`` is passed, because the default ``spmd_types`` backend's ``fully_shard`` refuses
the meta model on this torch ("all parameters must be DTensors on the full SPMD mesh").
FP8 stops, as it must on a CPU, at torchtitan's float8 converter refusing the hardware.

The model is examples/llama.py sized as torchtitan's llama3 debugmodel, read from the installed
registry (torchtitan_flavours.read_registry), so the exporter must find that flavour itself.
Skipped where torchtitan 0.3 is not installed (``pip install -c constraints.txt torchtitan``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autoplan.trace
from autoplan.export import torchtitan as titan
from autoplan.export import torchtitan_flavours
from autoplan.export.common import ModelFacts
from autoplan.export.torchtitan_flavours import Flavour, Registry, cache_path, facts_shape, read_registry
from autoplan.types import Plan
from autoplan.types.layout import chunks_of_stage, plan_groups
from autoplan.types.schedules import v_shaped

LAYERS6 = [f"layers.{i}" for i in range(6)]
PLANS = {
    "ddp_fp32_full": Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, recompute="full"),
    "zero3_bf16": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, zero_stage=3,
                       precision="bf16", recompute="selective"),
    # HSDP: 2 replicas of FSDP over 2 ranks, beside tp = 2 (data_parallel_replicate_degree)
    "hsdp2x2_tp2_zero3": Plan(devices=8, dp=4, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                              dp_replicate=2, sequence_parallel=True, precision="bf16"),
    # HSDP beside cp: 2 replicas of FSDP over dp_shard x cp = 1 x 2 ranks (torchtitan's dp_shard_cp mesh)
    "hsdp2_cp2_zero2": Plan(devices=4, dp=2, cp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=2,
                            dp_replicate=2, precision="bf16"),
    "tp2_sp_zero1_overlap": Plan(devices=8, dp=4, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1,
                                 precision="bf16", sequence_parallel=True, tp_comm_overlap=True),
    "tp2_no_sp": Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=4, num_microbatches=1, precision="bf16"),
    "pp2_tp2_interleaved": Plan(
        devices=8, dp=2, tp=2, pp=2, micro_batch_size=1, num_microbatches=8, schedule="interleaved_1f1b",
        virtual_stages=2, zero_stage=3, precision="bf16", sequence_parallel=True,
        stages=[LAYERS6[:1], LAYERS6[1:3], LAYERS6[3:5], LAYERS6[5:]],
    ),
    "pp2_zero_bubble_v2": Plan(
        devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule="interleaved_zb",
        virtual_stages=2, precision="bf16", stages=[LAYERS6[:1], LAYERS6[1:3], LAYERS6[3:5], LAYERS6[5:]],
    ),
    # the V schedules: torchtitan places chunks 0 and 2p - 1 on rank 0 (its style "v"), as types/layout.py does; a
    # world of its own each (two starts of one mesh shape in this process refuse FSDP2's second mesh)
    "pp3_zbv": Plan(devices=3, dp=1, tp=1, pp=3, micro_batch_size=1, num_microbatches=6, schedule="zbv",
                    virtual_stages=2, precision="bf16", stages=[[layer] for layer in LAYERS6]),
    "pp2_dualpipev": Plan(devices=8, dp=4, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule="dualpipev",
                          virtual_stages=2, zero_stage=3, precision="bf16",
                          stages=[LAYERS6[:2], LAYERS6[2:3], LAYERS6[3:4], LAYERS6[4:]]),
    "pp2_uneven_1f1b_zero0": Plan(devices=4, dp=2, tp=1, pp=2, micro_batch_size=2, num_microbatches=4,
                                  precision="bf16", stages=[LAYERS6[:1], LAYERS6[1:]]),
    "pp3_gpipe_zero2": Plan(devices=6, dp=2, tp=1, pp=3, micro_batch_size=1, num_microbatches=6, schedule="gpipe",
                            zero_stage=2, precision="bf16", recompute="full"),
    "ep2": Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, ep=2, zero_stage=3,
                precision="bf16"),
    "cp2_tp2_zero3": Plan(devices=8, dp=2, tp=2, pp=1, cp=2, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                          precision="bf16", sequence_parallel=True),
    "cp2_ring_zero0": Plan(devices=4, dp=2, tp=1, pp=1, cp=2, cp_variant="ring", micro_batch_size=1,
                           num_microbatches=2, precision="bf16"),
    "fp8_zero3": Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                      precision="fp8"),
    "zero3_bf16_offload_full": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2,
                                    zero_stage=3, precision="bf16", offload="full"),
}  # fmt: skip
NO_FLAVOUR = "no_flavour"  # examples/llama.py at its own sizes: no flavour of torchtitan's has them

STARTUP = textwrap.dedent(
    """
    import contextlib, importlib.util, io, json, os, sys, types
    import torch
    if importlib.util.find_spec("triton") is None:  # the expert-parallel kernels import triton; never run here
        kernels = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
        kernels.__getattr__ = lambda name: None
        sys.modules[kernels.__name__] = kernels
    import torchtitan.tools.utils as titan_utils
    titan_utils.device_type, titan_utils.device_module = "cpu", torch.cpu  # meshes on this CPU
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims, utils as dist_utils

    def start(folder, module, world):
        os.environ["NGPU"], os.environ["RANK"] = str(world), "0"
        args = ["--module", module, "--config", "autoplan_plan", "--comm.mode", "fake_backend",
                "--parallelism.spmd_backend", "full_dtensor"]
        with contextlib.redirect_stderr(io.StringIO()) as said:  # tyro prints its refusal, then exits
            try:
                config = ConfigManager().parse_args(args)
            except SystemExit:
                raise ValueError(" ".join(said.getvalue().split())) from None
        dims = ParallelDims.from_config(config.parallelism, dist_utils.init_distributed(config.comm))
        dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
        spec = config.model_spec
        spec.model.update_from_config(config=config)
        with torch.device("meta"):
            model = spec.model.build()
        model.verify_module_protocol()
        loss = config.loss.build(compile_config=config.compile)
        common = dict(parallel_dims=dims, training=config.training, parallelism=config.parallelism,
                      compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder=folder)
        p, t = config.parallelism, config.training
        out = {"flavor": [spec.name, spec.flavor], "dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard,
               "tp": dims.tp, "pp": dims.pp, "ep": dims.ep, "sp": p.enable_sequence_parallel,
               "reshard": p.fsdp_reshard_after_forward, "local": t.local_batch_size, "global": t.global_batch_size,
               "seq_len": t.seq_len, "param": t.mixed_precision_param, "reduce": t.mixed_precision_reduce,
               "ac": type(config.activation_checkpoint).__qualname__,
               "async_tp": config.compile.enable_async_tensor_parallel,
               "compile": config.compile.enable and "model" in config.compile.components,
               "pp_mbs": p.pipeline_parallel_microbatch_size, "cp": dims.cp, "fsdp": dims.fsdp_enabled,
               "balancer": p.context_parallel_load_balancer, "offload": t.enable_cpu_offload}
        if dims.cp > 1:  # rank 0's groups: the mesh order, and the ranks that hold the same weights (loss: batch x cp)
            names = ["cp", "loss"] + (["tp"] if dims.tp > 1 else [])  # torchtitan builds no mesh of size 1
            out["groups"] = {name: dims.get_mesh(name).mesh.flatten().tolist() for name in names}
            out["attention"] = type(next(iter(model.layers.values())).attention.inner_attention).__name__
        if dims.pp_enabled:
            schedule, parts, _, _ = spec.pipelining_fn(model, device=torch.device("cpu"), model_config=spec.model,
                                                       parallelize_fn=spec.parallelize_fn, loss_fn=loss, **common)
            out["schedule"], out["single"] = type(schedule).__name__, isinstance(schedule, PipelineScheduleSingle)
            out["rank0_parts"] = [[n for n, _ in m.named_children() if n != "layers"] +
                                  [f"layers.{k}" for k in m.layers] for m in parts]
        else:
            spec.parallelize_fn(model, **common)
        return out

    results = {}
    for folder, module, world in json.loads(sys.argv[1]):
        sys.path.insert(0, folder)
        try:
            results[module] = start(folder, module, world)
        except Exception as exc:  # report, so that one refused file does not hide the others
            results[module] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            sys.path.remove(folder)
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def registry() -> Registry:
    found = read_registry()
    if not found.version.startswith("0.3"):
        pytest.skip(f"torchtitan 0.3 is not installed ({found.reason or found.version}); pip install torchtitan==0.3.0")
    return found


def _trace(shape: dict[str, int | None]) -> ModelFacts:
    names = {"layers": "N_LAYERS", "dim": "DIM", "heads": "N_HEADS", "kv_heads": "N_KV_HEADS", "ffn": "FFN_DIM"}
    names["vocab"] = "VOCAB_SIZE"
    with pytest.MonkeyPatch.context() as env:
        for key, value in shape.items():
            env.setenv(f"AUTOPLAN_LLAMA_{names[key]}", str(value))
        return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def facts(registry) -> ModelFacts:
    """examples/llama.py with the sizes of the installed torchtitan's llama3 debugmodel."""
    debug = next(f for f in registry.flavours if (f.module, f.flavor) == ("llama3", "debugmodel"))
    return _trace(debug.shape)


@pytest.fixture(scope="module")
def exported(registry, facts):
    out = {name: titan.export(plan, facts, registry=registry) for name, plan in PLANS.items()}
    own = ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))
    return out | {NO_FLAVOUR: titan.export(PLANS["zero3_bf16"], own, registry=registry)}


@pytest.fixture(scope="module")
def started(exported, tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("titan03")
    jobs = []
    for name, result in exported.items():
        (folder / f"{name}.py").write_text(result.text)
        jobs.append((str(folder), name, PLANS.get(name, PLANS["zero3_bf16"]).devices))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, "-c", STARTUP, json.dumps(jobs)], capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [n for n, p in PLANS.items() if p.precision != "fp8" and p.offload == "none"])
def test_torchtitan_starts_each_export_with_the_plans_layout(name, started, facts, exported):
    plan, got = PLANS[name], started[name]
    assert "error" not in got, got.get("error")
    assert got["flavor"] == ["llama3", "debugmodel"]  # the traced shape's flavour, found by the exporter
    assert got["dp_replicate"] * got["dp_shard"] == plan.dp and (got["tp"], got["pp"], got["ep"]) == (
        plan.tp,
        plan.pp,
        plan.ep,
    )
    sharded = (plan.dp > 1 and plan.zero_stage > 0) or plan.cp > 1  # torchtitan's FSDP is over dp_shard x cp
    assert got["dp_replicate"] == (plan.dp_replicate if sharded else plan.dp)  # HSDP's replicas, or DDP's
    assert got["dp_shard"] == (plan.dp // plan.dp_replicate if sharded else 1)
    assert got["fsdp"] == (sharded and plan.dp * plan.cp > 1)
    assert got["cp"] == plan.cp and got["balancer"] == "headtail"  # head-tail load balancing, as priced
    if plan.cp > 1:  # torchtitan's (pp, dp_replicate, dp_shard, cp, tp) mesh is autoplan's (pp, dp, cp, tp)
        groups = plan_groups(pp=plan.pp, dp=plan.dp, tp=plan.tp, cp=plan.cp)
        ours = {"cp": groups["cp"][0], "tp": groups["tp"][0], "loss": groups["dp_cp"][0]}
        assert got["groups"] == {name: ours[name] for name in got["groups"]} and len(got["groups"]) >= 2
        assert got["attention"] == "FlexAttention"  # whose cp all-gathers K and V: torchtitan 0.3's one variant
        ring = " ".join(exported[name].unexpressed)
        assert ("torchtitan 0.3 has no ring context parallelism" in ring) == (plan.cp_variant == "ring")
    if sharded:
        assert got["reshard"] == ("always" if plan.zero_stage == 3 else "never")
    assert got["sp"] == (plan.sequence_parallel or plan.tp == 1)
    accumulation = got["global"] // (got["local"] * plan.dp)  # torchtitan's Trainer: gradient accumulation steps
    assert got["global"] == plan.global_batch_size and got["global"] % (got["local"] * plan.dp) == 0
    if plan.pp > 1:  # one pipeline of local / pp_mbs micro-batches (torchtitan's Trainer)
        assert (got["pp_mbs"], got["local"] // got["pp_mbs"], accumulation) == (
            plan.micro_batch_size,
            plan.num_microbatches,
            1,
        )
    else:
        assert (got["local"], accumulation) == (plan.micro_batch_size, plan.num_microbatches)
    assert got["seq_len"] == facts.seq_len and got["reduce"] == "float32"
    assert not got["offload"]
    assert got["param"] == ("float32" if plan.precision == "fp32" else "bfloat16")
    assert got["ac"] == {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[plan.recompute]
    assert got["async_tp"] == plan.tp_comm_overlap and got["compile"] == plan.tp_comm_overlap


@pytest.mark.parametrize("name", [n for n, p in PLANS.items() if p.pp > 1])
def test_torchtitans_pipeline_split_holds_the_plans_stages(name, started):
    plan, got = PLANS[name], started[name]
    expected = {
        "gpipe": "ScheduleGPipe",
        "1f1b": "Schedule1F1B",
        "interleaved_1f1b": "ScheduleInterleaved1F1B",
        "interleaved_zb": "ScheduleInterleavedZeroBubble",
        "zbv": "ScheduleZBVZeroBubble",
        "dualpipev": "ScheduleDualPipeV",
    }
    assert got["schedule"] == expected[plan.schedule] and got["single"] == (plan.virtual_stages == 1)
    chunks = plan.stages or [LAYERS6[i : i + 2] for i in range(0, 6, 2)]  # no stages: an even split of 6
    mine = chunks_of_stage(0, pp=plan.pp, virtual_stages=len(chunks) // plan.pp, v_shape=v_shaped(plan.schedule))
    rank0 = [chunks[i] for i in mine]  # torchtitan's loop (stage r, r + pp, ...) or V (r, 2 pp - 1 - r)
    assert [[m for m in part if m.startswith("layers.")] for part in got["rank0_parts"]] == rank0
    assert got["rank0_parts"][0][0] == "tok_embeddings"


def test_fp8_turns_compile_on_and_reaches_torchtitans_float8_converter(started, exported):
    assert "float8 is only supported on NVIDIA SM89" in started["fp8_zero3"]["error"]  # the CPU refused, not the file
    text = exported["fp8_zero3"].text
    assert "converters=[Float8LinearConverter.Config(model_compile_enabled=True)]" in text
    assert 'config.compile = CompileConfig(enable=True, components=["model", "loss"])' in text
    assert titan.read(text, devices=4).plan().precision == "fp8"
    assert "rowwise only" in " ".join(exported["fp8_zero3"].unexpressed)


def test_cpu_offload_reaches_fsdp2_and_stops_at_the_full_dtensor_backend_this_cpu_needs(started, exported):
    """offload="full" is torchtitan's ``training.enable_cpu_offload``; its start-up parses it and gets to
    ``fully_shard(offload_policy=CPUOffloadPolicy())``, where FSDP2's full-SPMD path (``--parallelism.spmd_backend
    full_dtensor``, which this CPU needs: module docstring) refuses the parameters' mesh. Not checked past that
    point here: the default backend on a GPU is what the export is for."""
    assert "config.training.enable_cpu_offload = True" in exported["zero3_bf16_offload_full"].text
    error = started["zero3_bf16_offload_full"]["error"]
    assert "Expected param's DTensor mesh to be the same mesh passed to fully_shard" in error


def test_a_model_without_a_flavour_is_refused_by_its_config_function_in_one_sentence(started, exported):
    said = " ".join(exported[NO_FLAVOUR].unexpressed)
    assert "no flavour of torchtitan 0.3.0's registry has the shape of 'llama' (layers 4, hidden 512" in said
    error = started[NO_FLAVOUR]["error"]
    assert error.startswith("ValueError: autoplan: no flavour") and "Set RECIPE above" in error


@pytest.mark.parametrize("name", PLANS)
def test_read_gives_the_plan_back(name, exported):
    plan = PLANS[name]
    back = titan.read(exported[name].text, devices=plan.devices).plan()
    same = ("devices", "dp", "tp", "pp", "cp", "ep", "micro_batch_size", "num_microbatches", "schedule",
            "virtual_stages", "dp_replicate")  # fmt: skip
    assert {k: getattr(back, k) for k in same} == {k: getattr(plan, k) for k in same}
    assert back.cp_variant == "allgather"  # the one torchtitan runs
    fsdp = plan.dp > 1 or plan.cp > 1  # ZeRO-0/1 are written as ZeRO-2 where torchtitan shards
    assert back.zero_stage == (
        2 if plan.zero_stage < 2 and (plan.zero_stage or plan.cp > 1) else plan.zero_stage if fsdp else 0
    )
    assert (back.recompute, back.precision, back.tp_comm_overlap) == (
        plan.recompute,
        plan.precision,
        plan.tp_comm_overlap,
    )
    assert back.sequence_parallel == (plan.tp > 1 and plan.sequence_parallel)
    assert back.offload == plan.offload


def test_read_takes_a_recipe_written_as_torchtitans_own():
    recipe = """
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import FullAC
    def llama3_70b():
        return Trainer.Config(
            training=TrainingConfig(local_batch_size=8, seq_len=8192, steps=1000),
            parallelism=ParallelismConfig(tensor_parallel_degree=8),
            activation_checkpoint=FullAC.Config(),
        )
    """
    imported = titan.read(textwrap.dedent(recipe), devices=64)
    fields = imported.fields
    assert (fields["dp"], fields["tp"], fields["zero_stage"], fields["recompute"]) == (8, 8, 3, "full")
    assert (fields["micro_batch_size"], fields["num_microbatches"]) == (8, 1)


# ---- which flavour: pure, on synthetic registries ------------------------------------------------
def _registry(*flavours: tuple[str, str, dict], version: str = "0.3.0") -> Registry:
    return Registry(version=version, flavours=[Flavour(m, f, f"{m}_{f}", shape) for m, f, shape in flavours])


def test_a_flavour_is_the_one_with_the_traced_shape_and_variants_do_not_count():
    facts = ModelFacts(name="m", layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, vocab_size=100)
    shape = facts_shape(facts) | {"ffn": 256}
    registry = _registry(("llama3", "tiny", shape), ("llama3", "tiny_flex", shape), ("llama3_ft", "tiny", shape))
    assert titan.pick_flavour(registry, facts, "py")[0].flavor == "tiny"
    unstated = _registry(("llama3", "tiny", shape | {"ffn": 512}))  # the trace states no FFN width: not compared
    assert titan.pick_flavour(unstated, facts, "py")[0] is not None
    wider = ModelFacts(**{**facts.__dict__, "ffn_hidden_size": 128})
    assert titan.pick_flavour(_registry(("llama3", "tiny", shape)), wider, "py")[0] is None  # the FFN differs
    both = _registry(("llama3", "tiny", shape), ("qwen3", "tiny", shape))
    flavour, why = titan.pick_flavour(both, facts, "py")
    assert flavour is None and "several torchtitan flavours" in why and "llama3 tiny, qwen3 tiny" in why


def test_without_torchtitan_the_flavour_is_named_as_unmatched():
    facts = ModelFacts(name="m", layers=4, hidden_size=64, num_heads=4, vocab_size=100)
    _, why = titan.pick_flavour(Registry(reason="torchtitan is not installed here"), facts, "py")
    assert why.startswith("the model flavour could not be matched: torchtitan is not installed here")
    plan = PLANS["zero3_bf16"]
    exported = titan.export(plan, facts, registry=Registry(reason="torchtitan is not installed here"))
    assert 'raise ValueError("autoplan: the model flavour could not be matched' in exported.text


# ---- the command line ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_folder(tmp_path_factory):
    from synthetic import synthetic_gpt, synthetic_profile

    from autoplan.solve.api import plan_graph
    from autoplan.solve.outputs import write_outputs

    graph, profile = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=8), synthetic_profile()
    result = plan_graph(graph, devices=4, profile=profile, batch_size=8, fix={"pp": 2})
    out = tmp_path_factory.mktemp("plan")
    write_outputs(out, result=result, graph=graph, profile=profile)
    return out


def test_the_cli_writes_toml_for_a_toml_out_and_refuses_a_format_that_does_not_fit(plan_folder, tmp_path, capsys):
    from autoplan.cli import main

    assert main(["export", str(plan_folder), "--to", "torchtitan", "--out", str(tmp_path / "mine.toml")]) == 0
    assert (tmp_path / "mine.toml").read_text().startswith("# torchtitan 0.2.x JobConfig")  # the name says TOML
    printed = capsys.readouterr()
    assert "flavour" in printed.err  # the synthetic GPT is no torchtitan flavour: said, not trained as debugmodel
    for argv, words in (
        (["--to", "deepspeed", "--format", "toml", "--out", str(tmp_path)], "--format chooses torchtitan's format"),
        (["--to", "torchtitan", "--format", "py", "--out", str(tmp_path / "t.toml")], "name the file .py"),
    ):
        assert main(["export", str(plan_folder), *argv]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("autoplan: error:") and words in errors[0], errors


def test_a_flavour_without_a_recipe_is_named_and_its_model_still_set():
    facts = ModelFacts(name="m", layers=4, hidden_size=64, num_heads=4, vocab_size=100, seq_len=32)
    registry = Registry(version="0.3.0", flavours=[Flavour("llama3", "1B", None, facts_shape(facts))])
    exported = titan.export(PLANS["zero3_bf16"], facts, registry=registry)
    assert "has llama3 1B (the traced shape) but no recipe" in " ".join(exported.unexpressed)
    assert 'config.model_spec = model_registry("1B")' in exported.text and "RECIPE = None" in exported.text
    assert "raise ValueError(" in exported.text


def test_a_registry_read_is_kept_and_reused_until_damaged(registry, tmp_path, monkeypatch):
    import torchtitan

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = cache_path(Path(torchtitan.__file__).parent)
    assert kept.parent == tmp_path / "autoplan"
    kept.parent.mkdir()
    kept.write_text(json.dumps({"version": "kept", "flavours": []}))
    assert read_registry().version == "kept"  # read from the cache, not the installation
    kept.write_text("{not json")
    # a damaged cache is read again from torchtitan (the registry fixture's read: the same subprocess)
    monkeypatch.setattr(torchtitan_flavours, "_read_registry_now", lambda timeout_s: registry)
    assert read_registry() == registry
    assert Registry.from_dict(json.loads(kept.read_text())) == registry  # and replaced
