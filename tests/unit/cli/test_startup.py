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
