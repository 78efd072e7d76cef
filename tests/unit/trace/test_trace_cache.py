"""The trace cache (autoplan/trace/cache.py): a second plan reuses the graph and gives the same
plan; editing the model file or a module it imports, or changing a size it reads from the
environment or the batch, traces again; a corrupt entry is ignored with a warning; a hit plans
without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.trace import api
from autoplan.types._check import json_file_text
from autoplan.types.graph import Graph

ROOT = Path(__file__).resolve().parents[3]
MODEL = """
import os
import torch
from sizes import width

DEPTH = int(os.environ.get("CACHE_TEST_DEPTH", 2))


def build_model():
    return torch.nn.Sequential(*[torch.nn.Linear(width(), width()) for _ in range(DEPTH)])


def example_inputs(batch_size):
    return (torch.randn(batch_size, width()),)
"""
SIZES = "def width():\n    return 64\n"


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A model file importing a module beside it; the cache in a temporary folder; the traces counted."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sizes.py").write_text(SIZES)
    (folder / "net.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "sizes", raising=False)  # another test's, from its own folder
    monkeypatch.setenv("AUTOPLAN_TRACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CACHE_TEST_DEPTH", raising=False)
    traces = []
    real = api.trace_model_file
    monkeypatch.setattr(api, "trace_model_file", lambda *a, **k: traces.append(a) or real(*a, **k))
    return folder / "net.py", traces


def _plan(path: Path, out: Path, *extra: str, batch: int = 8) -> dict:
    argv = ["plan", str(path), "--devices", "2", "--profile", "dgx-a100", "--batch", str(batch)]
    assert main([*argv, "--out", str(out), "--quiet", *extra]) == 0
    return _timeless(json.loads((out / "plan.json").read_text()))


def _timeless(data):
    """plan.json without the search's own wall time."""
    if isinstance(data, dict):
        return {k: _timeless(v) for k, v in data.items() if k != "search_time_s"}
    return [_timeless(v) for v in data] if isinstance(data, list) else data


def test_a_second_plan_reuses_the_trace_and_gives_the_same_plan(model, tmp_path):
    path, traces = model
    first = _plan(path, tmp_path / "a")
    second = _plan(path, tmp_path / "b")
    assert len(traces) == 1 and second == first
    text = (tmp_path / "a" / "graph.json").read_text()
    assert (tmp_path / "b" / "graph.json").read_text() == text  # the hit writes the entry's text as it is
    assert json_file_text(Graph.load(tmp_path / "b" / "graph.json").to_dict()) == text  # the loaded graph's own


def test_edits_and_sizes_miss(model, tmp_path, monkeypatch):
    path, traces = model
    _plan(path, tmp_path / "o")
    path.write_text(MODEL + "\n# edited\n")  # the model file's bytes
    _plan(path, tmp_path / "o")
    (path.parent / "sizes.py").write_text(SIZES + "\n# edited\n")  # a module it imports from its folder
    monkeypatch.delitem(sys.modules, "sizes")  # as a new process would, import the edited one
    _plan(path, tmp_path / "o")
    monkeypatch.setenv("CACHE_TEST_DEPTH", "3")  # a size it reads from the environment
    deeper = _plan(path, tmp_path / "o")
    _plan(path, tmp_path / "o", batch=16)  # the batch
    assert len(traces) == 5
    monkeypatch.setenv("UNRELATED_VARIABLE", "1")  # a variable the model does not read
    assert _plan(path, tmp_path / "o") == deeper and len(traces) == 5
    monkeypatch.delenv("CACHE_TEST_DEPTH")  # back to an earlier size: its entry is still there
    _plan(path, tmp_path / "o")
    assert len(traces) == 5


def test_a_corrupt_entry_is_ignored_with_a_warning(model, tmp_path, capsys):
    path, traces = model
    first = _plan(path, tmp_path / "a")
    for entry in (tmp_path / "cache").glob("*-*.json"):
        entry.write_text('{"reads": ')
    capsys.readouterr()
    assert _plan(path, tmp_path / "b") == first and len(traces) == 2
    err = capsys.readouterr().err
    assert "autoplan: warning: ignoring a trace cache entry" in err and "Traceback" not in err
    assert _plan(path, tmp_path / "c") == first and len(traces) == 2  # rewritten by the trace


def test_switched_off_by_flag_or_environment(model, tmp_path, monkeypatch):
    path, traces = model
    _plan(path, tmp_path / "o", "--no-trace-cache")
    _plan(path, tmp_path / "o", "--no-trace-cache")
    assert len(traces) == 2 and not (tmp_path / "cache").exists()
    monkeypatch.setenv("AUTOPLAN_TRACE_CACHE", "off")
    _plan(path, tmp_path / "o")
    assert len(traces) == 3 and not (tmp_path / "cache").exists()


def test_the_environment_is_stored_as_digests(model, tmp_path, monkeypatch):
    path, _ = model
    monkeypatch.setenv("CACHE_TEST_DEPTH", "2")
    _plan(path, tmp_path / "o")
    (entry,) = (p for p in (tmp_path / "cache").glob("*-*.json") if not p.name.endswith(".graph.json"))
    reads = json.loads(entry.read_text())["reads"]
    assert set(reads["env"]) == {"CACHE_TEST_DEPTH"} and reads["env"]["CACHE_TEST_DEPTH"] != "2"
    assert sorted(Path(f).name for f in reads["files"]) == ["net.py", "sizes.py"]


def test_a_hit_plans_without_torch(model, tmp_path):
    path, _ = model
    first = _plan(path, tmp_path / "a")
    probe = (
        "import sys; from autoplan.cli import main; "
        f"assert main(['plan', {str(path)!r}, '--devices', '2', '--profile', 'dgx-a100', '--batch', '8', "
        f"'--out', {str(tmp_path / 'b')!r}, '--quiet']) == 0; "
        "print([m for m in ('torch', 'torch._dynamo', 'sympy') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(path.parent)])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]"
    assert _timeless(json.loads((tmp_path / "b" / "plan.json").read_text())) == first
