"""The profiles of other accelerators (profiles/sources/other_accelerators.py): AMD MI300X, DGX B200 and
GB200 NVL72. They load, every number has a source, the generator reproduces the files, their datasheet
peaks and NVLink domain are what the sources say, and each plans a GPT across nodes (tp and ep groups on
an NVL72 span its 72-GPU domain)."""

import importlib.util
from pathlib import Path

import pytest
from synthetic import synthetic_gpt
from test_instance_profiles import _sources

from autoplan.profile import available_profiles, load_profile
from autoplan.solve.api import plan_graph
from autoplan.types.profile import COLLECTIVES

ACCELERATORS = ("mi300x", "dgx-b200", "gb200-nvl72")
GENERATOR = Path(__file__).resolve().parents[3] / "profiles" / "sources" / "other_accelerators.py"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("other_accelerators", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ACCELERATORS)
def test_profile_loads_and_every_number_has_a_source(name):
    assert name in available_profiles()
    profile = load_profile(name)
    assert profile.backend == "nccl" and profile.inter_node is not None
    assert set(profile.intra_node.collectives) == set(COLLECTIVES) == set(profile.inter_node.collectives)
    assert {"fp8", "bf16"} <= set(profile.device.peak_flops)
    assert profile.device.efficiency_for("matmul", "fp8").source != profile.device.efficiency["matmul"].source
    empty = [path for path, source in _sources(profile) if not (isinstance(source, str) and len(source.strip()) > 20)]
    assert not empty, f"{name}: no real source for {empty}"


def _leaves(value, path=()):
    """(path, leaf) pairs of a nested dict/list, floats as pytest.approx at 1e-9 relative: the generator's fits
    (numpy) differ in the last bits between CPUs (4e-11 relative, Intel against AMD), not a change of the file."""
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key], (*path, key))]
    if isinstance(value, list):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, (*path, i))]
    return [(path, pytest.approx(value, rel=1e-9) if isinstance(value, float) else value)]


def test_generator_reproduces_the_shipped_files(generator):
    for build in (generator.mi300x, generator.dgx_b200, generator.gb200_nvl72):
        profile = build()
        shipped = load_profile(profile.name).to_dict()
        assert _leaves(profile.to_dict()) == _leaves(shipped), f"{profile.name}: rerun {GENERATOR.name}"


def test_datasheet_figures_and_domains():
    mi300x, b200, nvl72 = (load_profile(n) for n in ACCELERATORS)
    assert mi300x.device.peak_flops["bf16"] == pytest.approx(1307.4e12) and mi300x.devices_per_node == 8
    assert b200.device.peak_flops["fp8"] == pytest.approx(4.5e15) and b200.devices_per_node == 8
    assert nvl72.device.peak_flops["bf16"] == pytest.approx(2.5e15) and nvl72.devices_per_node == 72
    # RCCL over xGMI: a point-to-point send uses one 64 GB/s link, far below NVLink's
    assert mi300x.intra_node.collectives["send_recv"].busbw_bytes_per_s < 64e9
    assert b200.intra_node.collectives["send_recv"].busbw_bytes_per_s > 10 * 64e9
    assert nvl72.inter_node.collectives["all_reduce"].busbw_bytes_per_s == pytest.approx(72 * 50e9 * 0.96)


@pytest.mark.parametrize("name,devices", [("mi300x", 16), ("dgx-b200", 16), ("gb200-nvl72", 144)])
def test_each_plans_a_gpt_across_nodes(name, devices):
    graph = synthetic_gpt(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024, batch=288)
    best = plan_graph(graph, devices=devices, profile=name, batch_size=288).best
    assert best.devices == devices and best.predicted.step_time_s > 0


def _figures(name: str) -> dict[str, tuple[float, float]]:
    return {k: (f.alpha_s, f.busbw_bytes_per_s) for k, f in load_profile(name).intra_node.collectives.items()}


def test_a_tp_group_may_span_the_trays_of_an_nvl72():
    """tp 16 stays inside one NVLink domain on the NVL72 (72 per node) but crosses InfiniBand on a DGX B200
    (8 per node); both profiles have the same NVLink 5 figures, so the gap is the domain's span."""
    assert _figures("gb200-nvl72") == _figures("dgx-b200")
    graph = synthetic_gpt(layers=2, hidden=2048, heads=16, vocab=32000, seq=512, batch=16)
    step = {
        name: plan_graph(graph, devices=16, profile=name, batch_size=16, fix="tp=16,pp=1").best.predicted
        for name in ("dgx-b200", "gb200-nvl72")
    }
    assert step["gb200-nvl72"].breakdown["tp_comm_s"] < 0.8 * step["dgx-b200"].breakdown["tp_comm_s"]
