"""A profile belongs to a machine: plan and run say when it is another one (profile/host.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autoplan.profile import host, load_profile


@pytest.fixture
def cpu_profile():
    profile = load_profile("cpu-gloo")
    return dataclasses.replace(
        profile, device=dataclasses.replace(profile.device, name="Intel(R) Xeon(R) Platinum 8375C CPU (2 threads)")
    )


def test_a_cpu_profile_of_another_cpu_model_is_named_with_the_fixing_command(monkeypatch, cpu_profile):
    monkeypatch.setattr(host, "cpu_model", lambda: "AMD EPYC 7R13 Processor")
    warning = host.device_mismatch(cpu_profile, running=False)
    assert "measured on Intel(R) Xeon(R) Platinum 8375C CPU, but this machine is AMD EPYC 7R13 Processor" in warning
    assert "`autoplan profile --out profiles/this-machine.yaml`" in warning and "(2 threads)" not in warning


def test_the_same_cpu_with_another_thread_count_is_the_same_machine(monkeypatch, cpu_profile):
    monkeypatch.setattr(host, "cpu_model", lambda: "Intel(R)  Xeon(R) Platinum 8375C CPU")
    assert host.device_mismatch(cpu_profile, running=False) is None
    assert host.device_mismatch(cpu_profile, running=True) is None


def test_a_gpu_cluster_profile_plans_silently_on_a_machine_without_gpus_but_a_run_says_so(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(host, "cpu_model", lambda: "AMD EPYC")
    a100 = load_profile("dgx-a100")
    assert host.device_mismatch(a100, running=False) is None
    assert "this machine is AMD EPYC with no GPU" in host.device_mismatch(a100, running=True)


def test_a_gpu_profile_on_another_gpu_warns_in_plan(monkeypatch):
    import torch

    monkeypatch.setattr(host, "_GPU_NODES", (__file__,))  # a machine whose GPU driver made its device node
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert "this machine is NVIDIA H100 80GB HBM3" in host.device_mismatch(load_profile("dgx-a100"), running=False)


def test_planning_without_a_gpu_driver_asks_no_torch(monkeypatch):
    """No driver's device node on Linux: no CUDA device can be here, so plan neither warns nor imports torch."""
    import torch

    monkeypatch.setattr(host, "_GPU_NODES", ("/nonexistent/nvidiactl",))
    monkeypatch.setattr(host.sys, "platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch asked"))
    assert host.device_mismatch(load_profile("dgx-a100"), running=False) is None


@pytest.mark.parametrize("measured, suggests", [(0.30, True), (0.24, False), (0.12, True)])
def test_run_ends_with_measured_beside_predicted_and_suggests_a_fix_beyond_25_percent(measured, suggests):
    lines = host.measured_beside_predicted(
        measured_s=measured, predicted_s=0.2, profile_name="cpu-gloo", run_dir="runs/a"
    )
    assert lines[0].startswith(f"step time: measured {measured:.4g} s, predicted 0.2 s")
    assert (len(lines) == 2) == suggests
    if suggests:
        assert "`autoplan calibrate runs/a --profile cpu-gloo --out profiles/cpu-gloo-calibrated.yaml`" in lines[1]


def test_plan_cli_prints_the_warning_on_stderr(monkeypatch, tmp_path, capsys, cpu_profile):
    from autoplan.cli import main
    from autoplan.profile import save_profile

    monkeypatch.setattr(host, "cpu_model", lambda: "AMD EPYC 7R13 Processor")
    path = tmp_path / "other.yaml"
    save_profile(cpu_profile, path)
    code = main(
        [
            "plan",
            str(Path(__file__).resolve().parents[3] / "examples/mlp.py"),
            "--devices",
            "2",
            "--profile",
            str(path),
            "--batch",
            "8",
            "--fix",
            "dp=2",
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ]
    )
    assert code == 0
    assert (
        "autoplan: warning: profile 'cpu-gloo' was measured on Intel(R) Xeon(R) Platinum 8375C CPU"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("here", "profile_device", "same"),
    [
        ("NVIDIA H200", "NVIDIA H200-SXM-141GB", True),  # what CUDA calls the part the datasheet profile describes
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100-SXM5-80GB", True),
        ("NVIDIA H100 PCIe", "NVIDIA H100-SXM5-80GB", False),  # another form factor, other clocks and power
        ("NVIDIA H200 NVL", "NVIDIA H200-SXM-141GB", False),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H200-SXM-141GB", False),
        ("AMD EPYC 7B13", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", False),
        ("AMD EPYC 7B13", "AMD EPYC 7B13 (2 threads)", True),
    ],
)
def test_same_device_reads_gpu_names_as_cuda_and_datasheets_spell_them(here: str, profile_device: str, same: bool):
    assert host.same_device(here, profile_device) is same
