"""CLI start-up: building the parser imports no heavy library, and frozen_imports leaves the
garbage collector as it found it."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from autoplan.cli.startup import frozen_imports

HEAVY = ("torch", "scipy", "pandas", "matplotlib", "rich", "pulp", "networkx", "torch.distributed")


def test_parser_builds_without_heavy_imports():
    code = (
        "import sys, autoplan.cli as cli; cli.build_parser(); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_every_command_still_registered():
    from autoplan.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"trace", "profile", "plan", "run", "report", "explain", "calibrate"} <= set(commands)


@pytest.mark.parametrize("enabled", [True, False])
def test_frozen_imports_restores_the_collector(enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        frozen_before = gc.get_freeze_count()
        with frozen_imports("json", "csv"):
            assert gc.get_freeze_count() > frozen_before  # the heap is frozen inside
            assert gc.isenabled() == enabled
            assert "csv" in sys.modules
        assert gc.get_freeze_count() == 0 and gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_frozen_imports_unfreezes_on_error():
    with pytest.raises(ModuleNotFoundError):
        with frozen_imports("autoplan_no_such_module"):
            pass
    assert gc.get_freeze_count() == 0 and gc.isenabled()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--json", "explain", "out"], True), (["explain", "out", "--json"], True), (["explain", "out"], False)],
)
def test_the_common_flags_hold_before_or_after_the_command(argv, expected):
    import autoplan.cli as cli

    args = cli.build_parser().parse_args(argv)
    assert args.json is expected and args.quiet is False and args.debug is False


#: what a rank imports and ``autoplan run``'s launcher need not: it waits on its ranks, so each second it
#: spends importing before it starts them is a second added to every run (autoplan/execute/job/contract.py)
RANK_ONLY = ("torch.distributed.tensor", "torch.distributed.fsdp", "torch._dynamo", "torch.distributed.checkpoint")
LAUNCH_PROBE = """
import sys
import autoplan.jobs.launcher as launcher
launcher.launch = lambda **kw: print([m for m in RANK_ONLY if m in sys.modules]) or 3  # 3: --verify failed
from autoplan.cli import main
sys.exit(main(sys.argv[1:]))
"""
TINY_MODEL = """
import torch
def build_model():
    return torch.nn.Linear(8, 8)
def example_inputs(batch_size):
    return (torch.randn(batch_size, 8),)
"""


def test_run_starts_its_ranks_before_importing_what_only_a_rank_needs(tmp_path):
    """``autoplan run --verify``'s checks (the plan, the model file, --verify's steps, the device rules) run
    in the launcher without DTensor, FSDP2, dynamo or the checkpoint reader: the launcher is replaced by
    one that prints what is imported when the ranks would start."""
    from autoplan.types.plan import Plan

    (tmp_path / "model.py").write_text(TINY_MODEL)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1).save(tmp_path / "plan.json")
    argv = ["run", str(tmp_path / "model.py"), "--plan", str(plan), "--steps", "2", "--verify"]
    argv += ["--out", str(tmp_path / "r")]
    probe = f"RANK_ONLY = {RANK_ONLY!r}\n{LAUNCH_PROBE}"
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "--verify found differences" in done.stderr, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
