"""The export API and CLI over the framework modules: recognising a config, the round trip through
a plan folder, pricing an existing config against the best plan, and bad input in one sentence."""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.errors import ExportError
from autoplan.export.api import detect_framework, export_plan, import_config, launch_for, price_config, write_export
from autoplan.export.common import Exported
from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import write_outputs

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=32)
    profile = synthetic_profile()
    result = plan_graph(graph, devices=16, profile=profile, batch_size=32, fix={"tp": 2, "pp": 2})
    out = tmp_path_factory.mktemp("plan")
    write_outputs(out, result=result, graph=graph, profile=profile)
    return out, graph, profile, result.best


@pytest.mark.parametrize("framework", ["torchtitan", "megatron", "deepspeed", "accelerate"])
def test_each_export_is_recognised_read_back_and_priced(folder, tmp_path, framework):
    out, graph, profile, best = folder
    exported = export_plan(out, to=framework)
    path = write_export(exported, tmp_path)
    written = path.read_text()  # the text, with its launch line (if any) naming where it was written
    assert path.name == exported.filename
    assert written.replace(launch_for(exported, path), exported.launch) == exported.text
    assert detect_framework(path, path.read_text()) == framework
    imported = import_config(path, devices=best.devices, batch_size=best.global_batch_size)
    plan = imported.plan()
    runs = best.pp if framework == "accelerate" else 1  # no pipelines there: pp ranks run as more dp ranks
    assert plan.devices == best.devices and plan.global_batch_size == best.global_batch_size * runs
    priced = price_config(path, graph=graph, profile=profile, devices=best.devices, batch_size=best.global_batch_size)
    assert priced.config_step_s > 0 and priced.best_step_s > 0
    assert priced.slower >= 1 - 1e-9 or priced.config_plan.lossy  # nothing exact beats the best plan


def test_facts_come_from_the_plan_folders_graph(folder):
    out, graph, _, _ = folder
    text = export_plan(out, to="megatron").text
    assert f"--num-layers {len(graph.layers)}" in text and "--hidden-size 256" in text


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [("a.json", "{not json", "is not valid JSON"), ("a.cfg", "hello world", "cannot tell which framework")],
)
def test_unrecognisable_configs_are_one_sentence(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ExportError, match=words):
        import_config(path)


def test_a_missing_config_or_plan_is_one_sentence(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        import_config(tmp_path / "nope.toml")
    with pytest.raises(ExportError, match="neither a plan.json nor a plan folder"):
        export_plan(tmp_path / "nope", to="deepspeed")


def test_the_cli_exports_warns_and_fails_in_one_sentence(folder, tmp_path):
    out, _, _, _ = folder
    run = [sys.executable, "-m", "autoplan.cli"]
    done = subprocess.run(
        [*run, "export", str(out), "--to", "deepspeed", "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert Path(summary["file"]).is_file() and summary["unexpressed"] and summary["launch"].startswith("deepspeed")
    bad = subprocess.run([*run, "export", str(tmp_path / "none"), "--to", "megatron"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    explain = subprocess.run([*run, "explain", "--config", summary["file"]], capture_output=True, text=True)
    assert explain.returncode == 2 and "needs --model and --profile" in explain.stderr


def _cli_here(*argv: str) -> subprocess.CompletedProcess:
    """``autoplan ARGV`` in this process (planning, export and explain start no process group): the
    CLI's own main, its exit code and what it printed, without a fresh interpreter's imports."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def test_the_cli_prices_an_exported_config_against_the_best_plan(tmp_path):
    """plan -> export -> explain --config, each a real command: the config is the best plan itself."""
    model, plan_dir = str(ROOT / "examples" / "gpt.py"), tmp_path / "plan"
    for argv in (
        ["plan", model, "--profile", "dgx-a100", "--devices", "16", "--batch", "64", "--out", str(plan_dir)],
        ["export", str(plan_dir), "--to", "megatron", "--out", str(tmp_path)],
    ):
        done = _cli_here("--quiet", *argv)
        assert done.returncode == 0, done.stderr
    config = str(tmp_path / "megatron_args.txt")
    explain = _cli_here("--json", "explain", "--config", config, "--model", model)
    assert explain.returncode == 2 and "needs --profile" in explain.stderr
    explain = _cli_here("--json", "explain", "--config", config, "--model", model, "--profile", "dgx-a100")
    assert explain.returncode == 0, explain.stderr
    result = json.loads(explain.stdout)
    assert result["framework"] == "megatron" and result["config_plan"] == result["best_plan"]
    assert result["slower"] == pytest.approx(1.0, rel=1e-6)


def test_an_export_without_a_launch_line_is_written_as_it_is(tmp_path):
    text = "def autoplan_plan():\n    pass\n"  # torchtitan's launch line names a module, not the file
    exported = Exported(framework="torchtitan", filename="autoplan_torchtitan.py", text=text, launch="")
    assert write_export(exported, tmp_path / "mine.py").read_text() == text
