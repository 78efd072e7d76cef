"""The shipped cloud-instance profiles (profiles/sources/instances.py): they load, every number has a
source, prices are dated, the network and price orderings hold, and the planner never picks bf16 on
the V100 (aws-p3), which has no bf16 peak."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from synthetic import synthetic_gpt

from autoplan.errors import PlanError
from autoplan.profile import available_profiles, load_profile
from autoplan.solve.api import plan_graph
from autoplan.types.pricing import DATE

INSTANCES = ("aws-p4d", "aws-p4de", "aws-p5", "aws-p5en", "gcp-a3-high", "azure-nd-h100-v5", "aws-p3")
GENERATOR = Path(__file__).resolve().parents[3] / "profiles" / "sources" / "instances.py"


def _sources(obj, path="profile"):
    """(path, source) of every dataclass in ``obj`` that has a ``source`` field."""
    if dataclasses.is_dataclass(obj):
        names = {f.name for f in dataclasses.fields(obj)}
        if "source" in names:
            yield path, obj.source
        for name in names - {"source"}:
            yield from _sources(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _sources(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _sources(value, f"{path}[{i}]")


@pytest.mark.parametrize("name", INSTANCES)
def test_instance_profile_loads_with_dated_sourced_pricing(name):
    assert name in available_profiles()
    profile = load_profile(name)
    assert profile.devices_per_node == 8 and profile.inter_node is not None
    pricing = profile.pricing
    assert pricing is not None and DATE.match(pricing.as_of), pricing.as_of
    assert pricing.devices_per_instance == 8 and pricing.instance and pricing.region
    assert 0.5 < pricing.on_demand_per_device_hour < 20  # dollars per GPU-hour, not per instance-hour
    assert "gpu_prices.csv" in pricing.source
    if pricing.spot_per_device_hour is not None:
        assert pricing.spot_source and pricing.spot_per_device_hour < pricing.on_demand_per_device_hour
    if pricing.spot_interruptions_per_device_hour is not None:
        assert pricing.spot_interruption_source


@pytest.mark.parametrize("name", INSTANCES)
def test_every_number_has_a_source(name):
    sources = dict(_sources(load_profile(name)))
    assert "profile.device" in sources and "profile.pricing" in sources
    assert any(path.startswith("profile.inter_node.collectives") for path in sources)
    empty = [path for path, source in sources.items() if not (isinstance(source, str) and len(source.strip()) > 20)]
    assert not empty, f"{name}: no real source for {empty}"


def test_generator_reproduces_the_shipped_files():
    spec = importlib.util.spec_from_file_location("instances_generator", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = [module.build(name, s) for name, s in module.INSTANCES.items()] + [module.build_p3()]
    assert sorted(p.name for p in built) == sorted(INSTANCES)
    for profile in built:
        assert profile.to_dict() == load_profile(profile.name).to_dict(), f"{profile.name}: rerun {GENERATOR.name}"


def test_instance_devices_and_networks_differ_where_the_rental_does():
    p4d, p4de, p5, dgx_h100 = (load_profile(n) for n in ("aws-p4d", "aws-p4de", "aws-p5", "dgx-h100"))
    assert p4d.device.memory_bytes == p4de.device.memory_bytes // 2  # A100 40 GB vs 80 GB
    assert p4d.device.memory_bandwidth_bytes_per_s < p4de.device.memory_bandwidth_bytes_per_s

    def inter(profile):
        return profile.inter_node.collectives["all_reduce"]

    assert inter(p5).busbw_bytes_per_s > 4 * inter(p4d).busbw_bytes_per_s  # 3200 vs 400 Gbps EFA
    assert inter(p5).busbw_bytes_per_s < inter(dgx_h100).busbw_bytes_per_s  # EFA below InfiniBand
    assert inter(p5).alpha_s > inter(dgx_h100).alpha_s  # and slower to start
    assert inter(load_profile("aws-p3")).busbw_bytes_per_s < inter(p4d).busbw_bytes_per_s


def test_prices_order_by_generation():
    price = {name: load_profile(name).pricing.on_demand_per_device_hour for name in INSTANCES}
    assert price["aws-p5"] > price["aws-p4de"] > price["aws-p4d"]
    assert price["aws-p5en"] > price["aws-p5"]


def _p3_plan(**kwargs):
    graph = synthetic_gpt(layers=2, hidden=256, heads=8, vocab=8000, seq=128, batch=16)
    return plan_graph(graph, devices=8, profile="aws-p3", batch_size=16, **kwargs)


def test_p3_has_no_bf16_and_the_planner_never_picks_it():
    peaks = load_profile("aws-p3").device.peak_flops
    assert "bf16" not in peaks and "fp16" in peaks
    result = _p3_plan(top_k=5)
    assert result.best.precision == "fp16"  # the half precision the V100 has
    seen = {c.plan.precision for c in result.candidates if c.plan is not None}
    seen |= {c.config.get("precision") for c in result.candidates}
    assert "bf16" not in seen and "fp16" in seen


def test_p3_pinned_bf16_is_one_clear_error():
    with pytest.raises(PlanError, match=r"precision=bf16 .*'aws-p3' has no bf16 peak; pick one of fp16, fp32\."):
        _p3_plan(fix="precision=bf16")
