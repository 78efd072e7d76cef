"""torchtitan 0.2.x export (``--format toml``): where torchtitan 0.2.2 is installed, every exported
TOML is loaded by its own ``ConfigManager`` (tyro's type warnings made errors), its degrees by
torchtitan's ``ParallelDims``, its schedule by torch's ``get_schedule_class`` and its chunks by
torchtitan's ``generate_llm_fqn_per_model_part``; the values they hold must equal the plan's.
Where it is not (the test extras pin 0.3), every key and value type is checked against 0.2.2's
``JobConfig`` fields (SCHEMA_022, copied from 0.2.2 and compared with it where it is installed).
``read`` gives the plan back.

torchtitan's package ``__init__`` imports triton (absent on CPU CI), so the check runs in a
subprocess that skips that ``__init__`` (the stub in ``sys.modules`` must not leak into other tests).
The flavour is matched against a registry that holds the traced shape (torchtitan_flavours.Registry):
0.2.2's real registry is read in test_torchtitan_py.py's way only where 0.2.2 is installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
import tomllib

import autoplan.trace
from autoplan.export import torchtitan as titan
from autoplan.export.common import ExportError, ModelFacts
from autoplan.export.torchtitan_flavours import Flavour, Registry, facts_shape
from autoplan.types import Plan

STAGES4 = [["layers.0"], ["layers.1"], ["layers.2"], ["layers.3"]]
PLANS = {
    "ddp-fp32": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=2, num_microbatches=4),
    "zero3-bf16-full": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=8, zero_stage=3, precision="bf16",
        recompute="full",
    ),
    "hsdp2x4-zero2": Plan(  # HSDP: 2 replicas of FSDP over 4 ranks (data_parallel_replicate_degree)
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=2, precision="bf16",
        dp_replicate=2,
    ),
    "hsdp2-cp2-zero2": Plan(  # HSDP beside cp: 2 replicas of FSDP over dp_shard x cp = 1 x 2 ranks
        devices=4, dp=2, cp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=2, precision="bf16",
        dp_replicate=2,
    ),
    "zero2-selective": Plan(
        devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, zero_stage=2, precision="bf16",
        recompute="selective",
    ),
    "zero2-compile": Plan(
        devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, zero_stage=2, precision="bf16",
        compile=True,
    ),
    "tp2-sp-zero1-overlap": Plan(
        devices=16, dp=8, tp=2, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1, precision="bf16",
        sequence_parallel=True, tp_comm_overlap=True,
        tp_plan={"layers.0.attn.q": "colwise", "layers.0.attn.o": "rowwise"},
    ),
    "pp2-tp2-interleaved": Plan(
        devices=16, dp=4, tp=2, pp=2, micro_batch_size=1, num_microbatches=8, schedule="interleaved_1f1b",
        virtual_stages=2, zero_stage=3, precision="bf16", sequence_parallel=True, stages=STAGES4,
    ),
    "pp4-1f1b-zero0": Plan(devices=8, dp=2, tp=1, pp=4, micro_batch_size=2, num_microbatches=8, precision="bf16",
                           stages=STAGES4),
    "pp2-gpipe-fp8": Plan(
        devices=4, dp=2, tp=1, pp=2, micro_batch_size=2, num_microbatches=4, schedule="gpipe", zero_stage=3,
        precision="fp8", stages=[["layers.0", "layers.1"], ["layers.2", "layers.3"]],
    ),
    "pp2-1f1b-two-schedule-steps": Plan(  # torchtitan's gradient accumulation: global / (local x dp) = 2
        devices=4, dp=2, tp=1, pp=2, micro_batch_size=1, num_microbatches=8, schedule_steps=2, precision="bf16",
        stages=[["layers.0", "layers.1"], ["layers.2", "layers.3"]],
    ),
    "pp2-uneven": Plan(
        devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, precision="bf16",
        stages=[["layers.0"], ["layers.1", "layers.2", "layers.3"]],
    ),
    "pp2-v2-uneven-middle": Plan(
        devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule="interleaved_1f1b",
        virtual_stages=2, stages=[["layers.0"], ["layers.1", "layers.2"], ["layers.3"], []],
    ),
    "pp2-v2-zero-bubble": Plan(
        devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule="interleaved_zb",
        virtual_stages=2, precision="bf16", stages=STAGES4,
    ),
    "tp2-no-sp": Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=4, num_microbatches=1, precision="bf16"),
    "ep2": Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, ep=2, zero_stage=3,
                precision="bf16"),
    "reduce-bf16-fp16": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3, precision="fp16",
        grad_reduce_dtype="bf16",
    ),
    "cp2-tp2-zero3": Plan(devices=8, dp=2, tp=2, pp=1, cp=2, micro_batch_size=1, num_microbatches=2, zero_stage=3,
                          precision="bf16", sequence_parallel=True),
    "cp2-ring-zero0": Plan(devices=4, dp=2, tp=1, pp=1, cp=2, cp_variant="ring", micro_batch_size=1,
                           num_microbatches=2, precision="bf16"),
    "powersgd-no-overlap": Plan(
        devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, grad_compression="powersgd",
        powersgd_rank=4,
    ),
}  # fmt: skip

# Parses each TOML with torchtitan's own ConfigManager and prints what torchtitan holds, as JSON.
PARSE = textwrap.dedent(
    """
    import importlib.util, json, math, sys, types, warnings
    spec = importlib.util.find_spec("torchtitan")
    package = types.ModuleType("torchtitan")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["torchtitan"] = package  # skip torchtitan/__init__.py, which imports triton
    kernels = types.ModuleType("torchtitan.models.moe.kernels")  # MoE triton kernels, never run here
    kernels.generate_permute_indices = None
    sys.modules[kernels.__name__] = kernels
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

    def load(path, world, layers):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # tyro only warns on a wrong type or Literal value
            cfg = ConfigManager().parse_args(["--job.config_file", path])
        p, t = cfg.parallelism, cfg.training
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                            ep=p.expert_parallel_degree, etp=1, world_size=world)
        out = {"cp": dims.cp, "fsdp": dims.fsdp_enabled, "balancer": p.context_parallel_load_balancer}
        out |= {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp, "pp": dims.pp,
               "ep": dims.ep, "reshard": p.fsdp_reshard_after_forward, "async_tp": p.enable_async_tensor_parallel,
               "compile": cfg.compile.enable and "model" in cfg.compile.components,
               "local": t.local_batch_size, "global": t.global_batch_size, "seq_len": t.seq_len,
               "param": t.mixed_precision_param, "reduce": t.mixed_precision_reduce,
               "ac": cfg.activation_checkpoint.mode, "ac_option": cfg.activation_checkpoint.selective_ac_option,
               "converters": cfg.model.converters,
               "recipe": cfg.quantize.linear.float8.recipe_name, "pp_mbs": p.pipeline_parallel_microbatch_size}
        out["model"] = [cfg.model.name, cfg.model.flavor]
        if dims.pp > 1:
            schedule = get_schedule_class(p.pipeline_parallel_schedule)
            out["schedule"] = schedule.__name__
            out["single"] = issubclass(schedule, PipelineScheduleSingle)
            first, last = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
            if p.module_fqns_per_model_part is not None:  # pipeline_llm takes the lists as they are
                out["chunks"] = p.module_fqns_per_model_part
            elif p.pipeline_parallel_layers_per_stage is not None:  # pipeline_llm: chunks from layers
                chunks = math.ceil((layers + first + last) / p.pipeline_parallel_layers_per_stage)
                out["chunks"] = generate_llm_fqn_per_model_part(chunks, layers, first, last)
        return out

    results = {}
    for path, world, layers in json.loads(sys.argv[1]):
        try:
            results[path] = load(path, world, layers)
        except Exception as exc:  # report, so that one bad file does not hide the others
            results[path] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(results))
    """
)


# torchtitan 0.2.2's JobConfig: each field the exporter may write, with its type (from 0.2.2's job_config.py)
SCHEMA_022 = {
    "job": {"description": str},
    "model": {"name": str, "flavor": str, "converters": list},
    "training": {
        "local_batch_size": int, "global_batch_size": int, "seq_len": int, "mixed_precision_param": str,
        "mixed_precision_reduce": str,
    },
    "parallelism": {
        "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int, "fsdp_reshard_after_forward": str,
        "tensor_parallel_degree": int, "enable_async_tensor_parallel": bool, "pipeline_parallel_degree": int,
        "module_fqns_per_model_part": list, "pipeline_parallel_first_stage_less_layers": int,
        "pipeline_parallel_last_stage_less_layers": int, "pipeline_parallel_layers_per_stage": int,
        "pipeline_parallel_schedule": str, "pipeline_parallel_microbatch_size": int, "context_parallel_degree": int,
        "context_parallel_load_balancer": str, "expert_parallel_degree": int,
    },
    "activation_checkpoint": {"mode": str, "selective_ac_option": str},
    "compile": {"enable": bool, "components": list},
    "quantize.linear.float8": {"recipe_name": str},
}  # fmt: skip


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    return ModelFacts.from_graph(autoplan.trace.trace_model_file("examples/llama.py", 2))


@pytest.fixture(scope="module")
def registry(facts) -> Registry:
    """A 0.2.2 registry holding the traced shape as llama3 debugmodel, and an attention variant of it."""
    flavours = [Flavour("llama3", name, None, facts_shape(facts)) for name in ("debugmodel", "debugmodel_flex_attn")]
    ends = {"input_modules": ["tok_embeddings"], "output_modules": ["norm", "output"]}
    return Registry(version="0.2.2", flavours=flavours, **ends)


def toml(plan: Plan, facts: ModelFacts, registry: Registry):
    return titan.export(plan, facts, fmt="toml", registry=registry)


@pytest.fixture(scope="module")
def parsed(facts, registry, tmp_path_factory) -> dict[str, dict]:
    """torchtitan's view of every exported plan, plus one file with a misspelt key and one with a bad type."""
    if importlib.util.find_spec("torchtitan") is None or not _installed_version().startswith("0.2"):
        pytest.skip("torchtitan 0.2.x is not installed (the test extras pin 0.3); SCHEMA_022 checks the keys")
    folder = tmp_path_factory.mktemp("titan")
    jobs, good = [], toml(PLANS["ddp-fp32"], facts, registry).text
    tampered = {
        "misspelt": good.replace("tensor_parallel_degree", "tensor_parallel_degre"),
        "bad-type": good.replace('mode = "none"', 'mode = "sometimes"'),
    }
    texts = {name: toml(plan, facts, registry).text for name, plan in PLANS.items()} | tampered
    for name, text in texts.items():
        path = folder / f"{name}.toml"
        path.write_text(text)
        jobs.append((str(path), PLANS.get(name, PLANS["ddp-fp32"]).devices, facts.layers))
    run = subprocess.run([sys.executable, "-c", PARSE, json.dumps(jobs)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    return {name: results[str(folder / f"{name}.toml")] for name in texts}


@pytest.mark.parametrize("name", PLANS)
def test_torchtitan_loads_the_export_with_the_plans_numbers(name, parsed, facts):
    plan, got = PLANS[name], parsed[name]
    assert "error" not in got, got.get("error")
    assert got["dp_replicate"] * got["dp_shard"] == plan.dp
    assert (got["tp"], got["pp"], got["ep"]) == (plan.tp, plan.pp, plan.ep)
    ddp = plan.zero_stage == 0 and plan.tp == plan.pp == plan.ep == plan.cp == 1
    assert got["cp"] == plan.cp and got["balancer"] == "headtail"  # head-tail load balancing, as priced
    assert got["fsdp"] == (not ddp and plan.dp * plan.cp > 1)  # torchtitan's FSDP: dp_shard x cp
    if plan.dp > 1:
        assert got["dp_shard"] == (1 if ddp else plan.dp // plan.dp_replicate)  # HSDP: FSDP over a shard group
        assert got["dp_replicate"] == (plan.dp if ddp else plan.dp_replicate)
        assert got["reshard"] == ("default" if ddp else "always" if plan.zero_stage == 3 else "never")
    assert got["global"] == plan.global_batch_size and got["seq_len"] == facts.seq_len
    accumulation = got["global"] // (got["local"] * plan.dp)  # torchtitan's Trainer: gradient accumulation steps
    assert got["global"] % (got["local"] * plan.dp) == 0
    if plan.pp > 1:  # one pipeline of local / pp_mbs micro-batches (torchtitan's build_pipeline_schedule)
        assert (got["pp_mbs"], got["local"] // got["pp_mbs"], accumulation) == (
            plan.micro_batch_size,
            plan.num_microbatches,
            1,
        )
    else:
        assert (got["local"], accumulation) == (plan.micro_batch_size, plan.num_microbatches)
    assert got["param"] == ("float32" if plan.precision == "fp32" else "bfloat16") and got["reduce"] == "float32"
    assert (got["converters"], got["recipe"]) == (
        (["quantize.linear.float8"], "tensorwise") if plan.precision == "fp8" else ([], None)
    )
    assert got["ac"] == plan.recompute and (plan.recompute != "selective" or got["ac_option"] == "op")
    assert got["async_tp"] == plan.tp_comm_overlap
    assert got["compile"] == (plan.tp_comm_overlap or plan.precision == "fp8")  # float8 wants compile
    assert got["model"] == ["llama3", "debugmodel"]  # the flavour with the traced shape, not its variant
    if plan.pp > 1:
        expected = {
            "gpipe": "ScheduleGPipe",
            "1f1b": "Schedule1F1B",
            "interleaved_1f1b": "ScheduleInterleaved1F1B",
            "interleaved_zb": "ScheduleInterleavedZeroBubble",
        }
        assert got["schedule"] == expected[plan.schedule] and got["single"] == (plan.virtual_stages == 1)


@pytest.mark.parametrize("name", [n for n, p in PLANS.items() if p.pp > 1])
def test_torchtitan_cuts_the_plans_pipeline_chunks(name, parsed):
    plan, got = PLANS[name], parsed[name]
    blocks = [[m for m in chunk if m.startswith("layers.")] for chunk in got["chunks"]]
    assert blocks == plan.stages
    assert got["chunks"][0][0] == "tok_embeddings" and got["chunks"][-1][-2:] == ["norm", "output"]


def test_torchtitans_parser_refuses_a_misspelt_key_and_a_bad_value(parsed):
    assert "Invalid field names" in parsed["misspelt"]["error"]
    assert "activation-checkpoint.mode" in parsed["bad-type"]["error"]  # tyro's warning, made an error


@pytest.mark.parametrize("name", PLANS)
def test_read_gives_the_plan_back(name, facts, registry):
    plan = PLANS[name]
    text = toml(plan, facts, registry).text
    for devices in (plan.devices, None):
        back = titan.read(text, devices=devices).plan()
        same = ("devices", "dp", "tp", "pp", "cp", "ep", "micro_batch_size", "num_microbatches", "schedule",
                "virtual_stages", "dp_replicate", "schedule_steps")  # fmt: skip
        assert {k: getattr(back, k) for k in same} == {k: getattr(plan, k) for k in same}
        assert back.cp_variant == "allgather"  # 0.2.2 trains with torch's default rotation
        ddp_only = plan.tp == plan.pp == plan.ep == plan.cp == 1
        zero = (
            0
            if plan.dp == plan.cp == 1
            else 2
            if plan.zero_stage == 1 or (plan.zero_stage == 0 and not ddp_only)
            else plan.zero_stage
        )
        assert back.zero_stage == zero
        assert back.recompute == plan.recompute
        mixed_off = plan.dp == plan.cp == 1 and (plan.tp > 1 or plan.pp > 1)  # torchtitan then trains in float32
        assert back.precision == ("fp32" if mixed_off else "bf16" if plan.precision == "fp16" else plan.precision)
        assert back.sequence_parallel == (plan.tp > 1) and back.tp_comm_overlap == plan.tp_comm_overlap
        # compile.enable: the plan's compile, and async TP and float8 need it too (torchtitan_toml.py)
        assert back.compile == (plan.compile or plan.tp_comm_overlap or plan.precision == "fp8")


def _comments(text: str) -> str:
    lines = [line.lstrip("#").strip().removeprefix("- ") for line in text.splitlines() if line.startswith("#")]
    return " ".join(" ".join(lines).split())


def test_unexpressed_items_are_named_in_the_result_and_the_file(facts, registry):
    def said(name: str) -> str:
        exported = toml(PLANS[name], facts, registry)
        for item in exported.unexpressed:
            assert " ".join(item.split()) in _comments(exported.text)
        return " ".join(exported.unexpressed)

    assert said("ddp-fp32") == "" and said("zero3-bf16-full") == ""
    assert "ZeRO-1" in said("tp2-sp-zero1-overlap") and "per-op choice" in said("tp2-sp-zero1-overlap")
    assert "ZeRO-0 with TP, PP or EP" in said("pp4-1f1b-zero0")
    assert "stages" not in said("pp2-uneven") and "stages" not in said("pp2-v2-uneven-middle")
    tp = said("tp2-no-sp")
    assert "without sequence parallelism" in tp and "runs in float32" in tp
    assert "fp16 training" in said("reduce-bf16-fp16") and "float32 only" in said("reduce-bf16-fp16")
    assert "PowerSGD" in said("powersgd-no-overlap")
    assert said("cp2-tp2-zero3") == ""
    ring = said("cp2-ring-zero0")
    assert "torchtitan 0.2.x has no ring context parallelism" in ring and "ZeRO-0 with cp=2" in ring


def test_zb_h1_is_written_as_1f1b_and_said(facts, registry):
    """torchtitan runs InterleavedZeroBubble with at least 2 stages per rank: ZB-H1 (v = 1) cannot be said."""
    plan = Plan(
        devices=2,
        dp=1,
        tp=1,
        pp=2,
        micro_batch_size=1,
        num_microbatches=4,
        schedule="interleaved_zb",
        precision="bf16",
        stages=[["layers.0", "layers.1"], ["layers.2", "layers.3"]],
    )
    exported = toml(plan, facts, registry)
    assert 'pipeline_parallel_schedule = "1F1B"' in exported.text
    assert any("ZB-H1" in note and "2 stages per rank" in note for note in exported.unexpressed)


def test_launch_command_is_torchruns(facts, registry):
    assert toml(PLANS["pp2-tp2-interleaved"], facts, registry).launch == (
        "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500 "
        "-m torchtitan.train --job.config_file torchtitan.toml"
    )
    assert toml(PLANS["zero2-selective"], facts, registry).launch.startswith("torchrun --nnodes 1 --nproc-per-node 4 ")


def test_read_names_what_autoplan_does_not_price():
    text = """
    [training]
    local_batch_size = 4
    global_batch_size = 64
    enable_cpu_offload = true
    [parallelism]
    data_parallel_replicate_degree = 2
    data_parallel_shard_degree = -1
    context_parallel_degree = 2
    pipeline_parallel_degree = 2
    pipeline_parallel_schedule = "LoopedBFS"
    [activation_checkpoint]
    mode = "memory_budget"
    [model]
    converters = ["quantize.linear.float8"]
    [quantize.linear.float8]
    recipe_name = "rowwise"
    """
    imported = titan.read(textwrap.dedent(text), devices=16)
    fields = imported.fields
    assert (fields["dp"], fields["pp"], fields["cp"], fields["devices"], fields["zero_stage"]) == (
        4,
        2,
        2,
        16,
        2,
    )  # default: no reshard with PP
    assert (fields["micro_batch_size"], fields["num_microbatches"]) == (1, 16)
    assert (fields["schedule"], fields["virtual_stages"]) == ("interleaved_1f1b", 2)
    said = " ".join(imported.unmapped)
    for words in ("LoopedBFS", "memory_budget", "rowwise", "CPU offload"):
        assert words in said
    assert fields["dp_replicate"] == 2 and "HSDP" not in said  # 2 replicas sharding over dp_shard x cp = 2 x 2
    assert "context" not in said and fields["cp_variant"] == "allgather"  # priced: torch's default rotation
    imported.plan()


def test_read_refuses_what_torchtitan_would_refuse():
    with pytest.raises(ExportError, match="pass the world size"):
        titan.read("[parallelism]\ntensor_parallel_degree = 2\n")
    with pytest.raises(ExportError, match="not the 8 devices"):
        titan.read("[parallelism]\ndata_parallel_shard_degree = 2\n", devices=8)
    with pytest.raises(ExportError, match="multiple of local_batch_size"):
        titan.read("[training]\nlocal_batch_size = 4\nglobal_batch_size = 10\n", devices=2)
    with pytest.raises(ExportError, match="not valid TOML"):
        titan.read("[parallelism")


@pytest.mark.parametrize("name", PLANS)
def test_every_key_is_a_torchtitan_022_field_of_its_type(name, facts, registry):
    data = tomllib.loads(toml(PLANS[name], facts, registry).text)
    data["quantize.linear.float8"] = data.pop("quantize", {}).get("linear", {}).get("float8", {})
    for section, table in data.items():
        for key, value in table.items():
            assert key in SCHEMA_022.get(section, {}), f"[{section}] {key} is not a torchtitan 0.2.2 field"
            assert isinstance(value, SCHEMA_022[section][key]), f"[{section}] {key} = {value!r}"


def test_the_schema_is_torchtitan_022s_where_it_is_installed():
    script = textwrap.dedent(
        """
        import dataclasses, importlib.util, json, sys, types
        spec = importlib.util.find_spec("torchtitan")
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = package  # skip torchtitan/__init__.py, which imports triton
        from torchtitan.config.job_config import JobConfig
        config = JobConfig()
        sections = {name: getattr(config, name) for name in json.loads(sys.argv[1])}
        sections["quantize.linear.float8"] = config.quantize.linear.float8
        print(json.dumps({name: [f.name for f in dataclasses.fields(obj)] for name, obj in sections.items()}))
        """
    )
    if importlib.util.find_spec("torchtitan") is None or not _installed_version().startswith("0.2"):
        pytest.skip("torchtitan 0.2.x is not installed; SCHEMA_022 is checked where it is")
    sections = [s for s in SCHEMA_022 if "." not in s]
    run = subprocess.run([sys.executable, "-c", script, json.dumps(sections)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    fields = json.loads(run.stdout.strip().splitlines()[-1])
    for section, keys in SCHEMA_022.items():
        assert set(keys) <= set(fields[section]), section


def _installed_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("torchtitan")


def test_a_model_no_flavour_matches_is_said_not_trained_as_debugmodel(facts):
    plan = PLANS["ddp-fp32"]
    other = Registry(version="0.2.2", flavours=[Flavour("llama3", "8B", None, {**facts_shape(facts), "layers": 32})])
    exported = toml(plan, facts, other)
    assert "\n[model]" not in exported.text
    said = " ".join(exported.unexpressed)
    assert "no flavour of torchtitan 0.2.2's registry has the shape of 'llama'" in said and "layers 4" in said
    newer = toml(plan, facts, Registry(version="0.3.0", flavours=other.flavours))
    assert "torchtitan 0.3.0 is installed here, not 0.2.x" in " ".join(newer.unexpressed)
