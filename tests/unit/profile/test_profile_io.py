"""Profiles load, validate, round-trip (YAML and JSON), and bad files give one clear line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from autoplan.cli import main
from autoplan.errors import ProfileError
from autoplan.profile import available_profiles, load_profile, save_profile
from autoplan.profile.io import profile_file, resolve_profile_path
from autoplan.types.profile import COLLECTIVES, Profile

SHIPPED = ["dgx-a100", "dgx-h100", "dgx-h200", "cpu-gloo", "mi300x", "dgx-b200", "gb200-nvl72"]


@pytest.fixture
def data() -> dict:
    return load_profile("dgx-a100").to_dict()


def _write(tmp_path: Path, data: object, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_validates_and_names_its_sources(name: str) -> None:
    profile = load_profile(name)
    assert name in available_profiles()
    assert profile.device.peak_flops and all(v > 0 for v in profile.device.peak_flops.values())
    for link in filter(None, [profile.intra_node, profile.inter_node]):
        assert set(link.collectives) == set(COLLECTIVES)
        assert all(fit.busbw_bytes_per_s > 0 and fit.source.strip() for fit in link.collectives.values())


def test_cpu_profile_records_threads_and_raw_points() -> None:
    profile = load_profile("cpu-gloo")
    assert profile.backend == "gloo" and profile.threads >= 1
    points = profile.intra_node.collectives["all_reduce"].points
    assert len(points) >= 5 and points[0][0] == profile.devices_per_node
    assert profile.device.op_table and all(row.time_s > 0 for row in profile.device.op_table)


def test_datasheet_numbers_match_hardware_csv() -> None:
    a100, h100 = load_profile("dgx-a100"), load_profile("dgx-h100")
    assert a100.device.peak_flops["bf16"] == pytest.approx(312e12)
    assert h100.device.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert a100.inter_node.collectives["all_reduce"].busbw_bytes_per_s == pytest.approx(192e9)
    assert 150e9 < a100.intra_node.collectives["all_reduce"].busbw_bytes_per_s < 240e9


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    original = load_profile("cpu-gloo")
    path = save_profile(original, tmp_path / f"copy{suffix}")
    assert load_profile(path).to_dict() == original.to_dict()
    assert not list(tmp_path.glob(".*.tmp"))


def test_load_by_path_and_profile_passthrough(tmp_path: Path, data: dict) -> None:
    profile = load_profile(_write(tmp_path, data))
    assert isinstance(profile, Profile) and load_profile(profile) is profile


def test_exponent_floats_without_dot_are_read_as_numbers(tmp_path: Path, data: dict) -> None:
    text = yaml.safe_dump(data) + "price_per_device_hour: 2e0\nprice_source: test\n"  # the older flat fields
    assert load_profile(_write(tmp_path, text)).price_per_device_hour == 2.0
    text = yaml.safe_dump(data) + "pricing: {on_demand_per_device_hour: 3e0, source: test, as_of: 2026-01-21}\n"
    assert load_profile(_write(tmp_path, text)).pricing.as_of == "2026-01-21"


def _broken(data: dict, edit) -> dict:
    data = copy.deepcopy(data)
    edit(data)
    return data


BAD_CASES = {
    "missing field": (lambda d: d["device"].pop("peak_flops"), "missing the field 'device.peak_flops'"),
    "negative bandwidth": (
        lambda d: d["intra_node"]["collectives"]["all_reduce"].__setitem__("busbw_bytes_per_s", -1.0),
        "'intra_node.collectives.all_reduce.busbw_bytes_per_s' is -1.0",
    ),
    "unknown dtype": (lambda d: d["device"]["peak_flops"].__setitem__("fp7", 1e12), "dtype 'fp7'"),
    "unknown field": (lambda d: d.__setitem__("colour", "red"), "unknown field 'colour'"),
    "missing collective": (lambda d: d["intra_node"]["collectives"].pop("all_to_all"), "has no 'all_to_all'"),
    "efficiency above one": (
        lambda d: d["device"]["efficiency"]["matmul"].__setitem__("max_efficiency", 1.5),
        "max_efficiency' is 1.5",
    ),
    "empty source": (lambda d: d["device"].__setitem__("source", ""), "'device.source'"),
    "bad backend": (lambda d: d.__setitem__("backend", "mpi"), "'backend' is 'mpi'"),
    "not a mapping": (lambda d: d.__setitem__("device", [1, 2]), "'device' is list"),
    "negative op overhead": (
        lambda d: d["device"].__setitem__("op_overhead", {"forward_s": -1.0, "backward_s": 1e-6, "source": "x"}),
        "'device.op_overhead.forward_s' is -1.0",
    ),
    "op overhead without source": (
        lambda d: d["device"].__setitem__("op_overhead", {"forward_s": 1e-6, "backward_s": 1e-6, "source": ""}),
        "'device.op_overhead.source'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_fields_give_one_line_naming_field_and_value(tmp_path: Path, data: dict, case: str) -> None:
    edit, expected = BAD_CASES[case]
    path = _write(tmp_path, _broken(data, edit))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert expected in message and "\n" not in message and str(path) in message


def test_missing_file_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.yaml")
    with pytest.raises(ProfileError, match="unknown profile or instance 'dgx-z9'; use one of: .*dgx-a100"):
        load_profile("dgx-z9")


def test_every_command_resolves_a_profile_name_one_way(tmp_path: Path, monkeypatch, capsys) -> None:
    """A stem, an instance family (``p5``: the one stem ending in ``-p5``) and a file path name the
    same profile for ``load_profile`` and the commands; a family that names two stems is refused."""
    assert load_profile("p5").name == load_profile("aws-p5").name == "aws-p5"
    assert main(["profile", "--json", "--show", "p5"]) == 0 and '"name": "aws-p5"' in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()
    for stem in ("gcp-p5", "aws-p5"):
        (tmp_path / "profiles" / f"{stem}.yaml").write_text(Path(resolve_profile_path("aws-p5")).read_text())
    with pytest.raises(ProfileError, match="unknown profile or instance 'p5'"):
        load_profile("p5")
    assert profile_file("aws-p5") is None and profile_file(Path("profiles/gcp-p5.yaml")) == str(
        tmp_path / "profiles" / "gcp-p5.yaml"
    )


def test_bad_yaml_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"not valid YAML .* line \d"):
        load_profile(_write(tmp_path, "name: x\ndevice: [1, 2\n"))
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(_write(tmp_path, "{bad", "p.json"))


def test_save_rejects_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="suffix '.txt'"):
        save_profile(load_profile("dgx-h100"), tmp_path / "p.txt")


def test_cli_show_prints_one_line_error_and_exits_2(tmp_path: Path, data: dict, capsys: pytest.CaptureFixture) -> None:
    bad = _write(tmp_path, _broken(data, lambda d: d["device"].__setitem__("memory_bandwidth_bytes_per_s", -5)))
    assert main(["profile", "--show", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "memory_bandwidth_bytes_per_s' is -5" in err
    assert main(["profile", "--show", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_show_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "--json", "--show", "dgx-h200"]) == 0
    out = capsys.readouterr().out
    assert '"devices_per_node": 8' in out and '"inter_node"' in out


def test_cli_measure_needs_out(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "--devices", "2"]) == 2
    assert "--out" in capsys.readouterr().err


def test_refresh_needs_an_existing_profile_at_out(tmp_path: Path, capsys) -> None:
    from autoplan.cli import main

    assert main(["profile", "--refresh", "op_overhead"]) == 2
    assert "needs --out" in capsys.readouterr().err
    assert main(["profile", "--refresh", "comm_overlap", "--out", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


@pytest.mark.parametrize("stem", available_profiles())
def test_libyaml_reads_every_profile_as_the_python_loader_does(stem: str) -> None:
    """profile/io.py reads YAML with libyaml's parser (_FastLoader): the same values, of the same types, as
    the pure-Python loader it replaces, on every profile found (repr tells 1 from 1.0 and True)."""
    from autoplan.profile.io import _FastLoader, _Loader, _yaml_data

    text = Path(resolve_profile_path(stem)).read_text()
    assert repr(_yaml_data(text)) == repr(yaml.load(text, Loader=_Loader))
    assert _FastLoader.__mro__[1] is getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@pytest.mark.parametrize(
    "text",
    [
        "a: 2e0\nb: 1e-5\nc: 200e9\nd: 1.5E+3\ne: 3\nf: 0.5\ng: yes\nh: 2026-01-21\ni: [1, 2e3, '1e3']\nj: ~\n",
        "name: x\ndevice: [1, 2\n",  # unparsable: the pure-Python loader's error stands
        "a: 1\n\tb: 2\n",
    ],
)
def test_libyaml_values_and_errors_are_the_python_loaders(text: str) -> None:
    from autoplan.profile.io import _Loader, _yaml_data

    try:
        expected = repr(yaml.load(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        expected = f"{type(exc).__name__}: {exc}"
    try:
        found = repr(_yaml_data(text))
    except yaml.YAMLError as exc:
        found = f"{type(exc).__name__}: {exc}"
    assert found == expected
