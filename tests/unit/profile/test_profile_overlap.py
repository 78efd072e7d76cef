"""comm_overlap: the measured fraction of a collective that hides under compute (profile field and formula)."""

from __future__ import annotations

import copy

import pytest
import yaml

from autoplan.errors import ProfileError
from autoplan.profile import load_profile
from autoplan.profile.measure.overlap import merge_overlap, overlap_efficiency
from autoplan.types.profile import DEFAULT_OVERLAP_SOURCE, CommOverlap, Profile


@pytest.mark.parametrize(
    "comp, comm, both, expected",
    [
        (1.0, 0.5, 1.0, 1.0),  # perfect: the shorter one vanished
        (1.0, 0.5, 1.5, 0.0),  # none: the times add
        (1.0, 0.5, 1.25, 0.5),  # half of the collective hid
        (1.0, 0.5, 1.8, 0.0),  # contention made both slower than in sequence: clipped
        (1.0, 0.5, 0.9, 1.0),  # faster than the longer one alone (noise): clipped
        (0.0, 0.5, 0.5, 0.0),  # nothing to hide under
    ],
)
def test_overlap_efficiency_formula(comp, comm, both, expected):
    assert overlap_efficiency(compute_s=comp, comm_s=comm, both_s=both) == pytest.approx(expected)


def test_merge_takes_the_slowest_rank_per_timing():
    assert merge_overlap([(1.0, 0.2, 1.1), (0.9, 0.3, 1.0)]) == (1.0, 0.3, 1.1)


def test_gpu_profiles_overlap_fully_and_cpu_profile_is_measured():
    for name in ("dgx-a100", "dgx-h100", "dgx-h200"):
        overlap = load_profile(name).comm_overlap
        assert overlap.efficiency == 1.0 and "NCCL" in overlap.source
    cpu = load_profile("cpu-gloo").comm_overlap
    assert cpu.source.startswith("measured on")
    assert cpu.both_s > 0 and cpu.efficiency == pytest.approx(
        overlap_efficiency(compute_s=cpu.compute_s, comm_s=cpu.comm_s, both_s=cpu.both_s), abs=1e-3
    )


def test_missing_field_defaults_to_full_overlap(tmp_path):
    data = load_profile("dgx-a100").to_dict()
    del data["comm_overlap"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    overlap = load_profile(path).comm_overlap
    assert overlap.efficiency == 1.0 and overlap.source == DEFAULT_OVERLAP_SOURCE


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("efficiency", 1.5, "comm_overlap.efficiency"),
        ("efficiency", -0.1, "comm_overlap.efficiency"),
        ("source", "", "comm_overlap.source"),
        ("both_s", -1.0, "comm_overlap.both_s"),
    ],
)
def test_bad_overlap_is_one_clear_error(field, value, needle):
    data = load_profile("dgx-a100").to_dict()
    data["comm_overlap"][field] = value
    with pytest.raises(ProfileError, match=needle):
        Profile.from_dict(data)


def test_unknown_overlap_field_is_rejected(tmp_path):
    data = load_profile("dgx-a100").to_dict()
    data["comm_overlap"]["eff"] = 0.5
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="comm_overlap.eff"):
        load_profile(path)


def test_round_trip_keeps_the_measurement():
    profile = load_profile("cpu-gloo")
    again = Profile.from_dict(copy.deepcopy(profile.to_dict()))
    assert again.comm_overlap == profile.comm_overlap


def test_hidden_time_is_efficiency_of_the_shorter():
    overlap = CommOverlap(efficiency=0.25, source="test")
    assert overlap.hidden_s(compute_s=2.0, comm_s=1.0) == pytest.approx(0.25)
    assert overlap.hidden_s(compute_s=0.5, comm_s=1.0) == pytest.approx(0.125)
