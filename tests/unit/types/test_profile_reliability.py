"""A profile's optional storage and reliability sections: validated, sourced, round-tripped."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from autoplan.errors import ProfileError
from autoplan.profile import load_profile, save_profile
from autoplan.types.profile import Profile
from autoplan.types.reliability import ReliabilitySpec, StorageSpec

GPU_PROFILES = ["dgx-a100", "dgx-h100", "dgx-h200"]


@pytest.fixture
def data() -> dict:
    return load_profile("dgx-h100").to_dict()


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_shipped_gpu_profiles_carry_sourced_storage_and_reliability(name):
    profile = load_profile(name)
    assert isinstance(profile.storage, StorageSpec) and isinstance(profile.reliability, ReliabilitySpec)
    assert "Llama 3" in profile.storage.source and profile.reliability.restart_source.startswith("assumed")
    # Tectonic: 2 TB/s sustained shared by 16,384 GPUs, 7 TB/s peak
    assert profile.storage.write_bytes_per_s(16384) == pytest.approx(2e12)
    assert profile.storage.write_bytes_per_s(10**6) == pytest.approx(7e12)


def test_llama3_failure_rate_gives_its_three_hour_mtbf():
    h100 = load_profile("dgx-h100").reliability
    assert h100.failures_per_device_hour == pytest.approx(419 / (16384 * 54 * 24))
    assert h100.job_mtbf_s(16384) / 3600 == pytest.approx(54 * 24 / 419)  # ~3.09 h, "one every three hours"
    assert load_profile("dgx-a100").reliability.job_mtbf_s(16384) / 3600 == pytest.approx(1.8)  # Kokolis et al.


def test_cpu_profile_has_neither_section():
    profile = load_profile("cpu-gloo")
    assert profile.storage is None and profile.reliability is None


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_sections_round_trip_through_yaml_and_json(tmp_path: Path, suffix: str):
    original = load_profile("dgx-a100")
    copy_ = load_profile(save_profile(original, tmp_path / f"p{suffix}"))
    assert copy_.storage == original.storage and copy_.reliability == original.reliability
    assert copy_.to_dict() == original.to_dict()


def test_the_cap_is_optional(data):
    data["storage"]["max_total_bytes_per_s"] = None
    storage = Profile.from_dict(data).storage
    assert storage.write_bytes_per_s(65536) == pytest.approx(65536 * storage.write_bytes_per_s_per_device)


BAD = {
    "negative write": (("storage", "write_bytes_per_s_per_device", -1.0), "'storage.write_bytes_per_s_per_device'"),
    "zero read": (("storage", "read_bytes_per_s_per_device", 0), "'storage.read_bytes_per_s_per_device' is 0"),
    "string cap": (("storage", "max_total_bytes_per_s", "fast"), "'storage.max_total_bytes_per_s' is 'fast'"),
    "no storage source": (("storage", "source", " "), "'storage.source'"),
    "zero failure rate": (("reliability", "failures_per_device_hour", 0.0), "failures_per_device_hour' is 0.0"),
    "negative restart": (("reliability", "restart_s", -5), "'reliability.restart_s' is -5; expected a number >= 0"),
    "bool rate": (("reliability", "failures_per_device_hour", True), "failures_per_device_hour' is True"),
    "no restart source": (("reliability", "restart_source", ""), "'reliability.restart_source'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_fields_give_one_profile_error_line(tmp_path: Path, data: dict, case: str):
    (section, name, value), expected = BAD[case]
    broken = copy.deepcopy(data)
    broken[section][name] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert expected in message and "\n" not in message and str(path) in message


def test_unknown_and_missing_fields_are_named(tmp_path: Path, data: dict):
    for edit, expected in (
        (lambda d: d["reliability"].__setitem__("mtbf_h", 5), "unknown field 'reliability.mtbf_h'"),
        (lambda d: d["storage"].pop("read_bytes_per_s_per_device"), "storage.read_bytes_per_s_per_device"),
        (lambda d: d.__setitem__("reliability", [1]), "'reliability' is list"),
    ):
        broken = copy.deepcopy(data)
        edit(broken)
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(broken))
        with pytest.raises(ProfileError, match=expected):
            load_profile(path)


def test_a_section_built_in_code_is_checked_too(data):
    profile = Profile.from_dict(data)
    with pytest.raises(ProfileError, match="'reliability' is"):
        Profile(**{**profile.__dict__, "reliability": "often"})
