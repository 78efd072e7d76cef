"""``autoplan profile`` measures the host section offload is priced with (profile/measure/host_offload.py)."""

from __future__ import annotations

import json

import torch

from autoplan.profile.measure.host_offload import measure_host


def test_the_host_section_is_measured_with_its_sources():
    host = measure_host(device=torch.device("cpu"), devices=2, threads=1, link_bytes=2**20, adam_params=2**14)
    host.check()  # positive figures, each with a source
    assert host.link_bytes_per_s > 0 and host.adam_params_per_s > 0
    assert "torch.optim.Adam" in host.adam_source and "host to host" in host.link_source


def test_profile_show_prints_the_host_section(capsys):
    from autoplan.cli import main

    assert main(["profile", "--show", "cpu-gloo", "--json"]) == 0
    host = json.loads(capsys.readouterr().out)["host"]
    assert host["adam_params_per_s"] > 0 and host["link_bytes_per_s"] > 0
