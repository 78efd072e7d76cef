"""What the commands write, as a user finds it (issue 30 item 17): files made as a plain write makes
them (the umask's mode, not mkstemp's 0600; an existing file keeps its mode), ``export --out DIR/``
writing into the folder and printing the launch line for the file it wrote, and a sweep folder that
``report`` and ``export`` take as the plan folder of its recommended point."""

import json
import os
import stat
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.export.api import export_plan
from autoplan.types.plan import Plan

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")
SMALL_GPT = {"N_LAYER": "2", "N_EMBD": "32", "N_HEAD": "4", "VOCAB_SIZE": "128", "BLOCK_SIZE": "16"}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    """Run under a given umask, restoring the process's own after."""
    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """One small sweep (one point), written under umask 022."""
    out = tmp_path_factory.mktemp("sweep")
    saved = os.umask(0o022)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for field, value in SMALL_GPT.items():
                patch.setenv(f"AUTOPLAN_GPT_{field}", value)
            argv = ["sweep", GPT, "--devices", "8", "--profile", "aws-p4d", "--batch", "16", "--steps", "1000"]
            assert main([*argv, "--out", str(out), "--quiet"]) == 0
    finally:
        os.umask(saved)
    return out


def test_a_sweep_folder_is_the_plan_folder_of_its_recommended_point(sweep_dir, tmp_path, umask, capsys):
    assert {"sweep.csv", "pareto.png", "plan.json", "plans.csv", "graph.json", "profile.json"} <= {
        p.name for p in sweep_dir.iterdir()
    }
    assert Plan.load(sweep_dir / "plan.json").graph_signature  # the graph.json beside it is its own
    assert main(["report", str(sweep_dir), "--out", str(tmp_path / "report")]) == 0
    assert main(["export", str(sweep_dir), "--to", "megatron", "--out", str(tmp_path / "m.txt"), "--quiet"]) == 0
    assert "--num-layers 2" in (tmp_path / "m.txt").read_text()  # the model facts came from its graph.json
    written = [p for folder in (sweep_dir, tmp_path / "report") for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".png" for p in written) and any(p.suffix == ".json" for p in written)
    assert {p.name: _mode(p) for p in written} == {p.name: 0o644 for p in written}  # umask 022, as open() gives


def test_files_follow_the_umask_and_an_existing_file_keeps_its_mode(sweep_dir, tmp_path, umask, capsys):
    umask(0o077)
    assert main(["export", str(sweep_dir), "--to", "deepspeed", "--out", str(tmp_path / "ds.json"), "--quiet"]) == 0
    assert _mode(tmp_path / "ds.json") == 0o600
    (tmp_path / "ds.json").chmod(0o640)
    assert main(["export", str(sweep_dir), "--to", "deepspeed", "--out", str(tmp_path / "ds.json"), "--quiet"]) == 0
    assert _mode(tmp_path / "ds.json") == 0o640


@pytest.mark.parametrize("framework", ["torchtitan", "megatron", "deepspeed", "accelerate"])
def test_export_into_a_folder_and_launch_the_file_it_wrote(sweep_dir, tmp_path, capsys, framework):
    new = tmp_path / "configs" / "run 1"  # not there yet, and a space the launch line must quote
    assert main(["export", str(sweep_dir), "--to", framework, "--out", f"{new}/", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    path = Path(printed["file"])
    assert path.parent == new and path.name == printed["filename"] and path.is_file()
    exported = export_plan(sweep_dir, to=framework)  # the default file, whose launch line (if it has one) names itself
    has_launch = exported.launch in exported.text  # DeepSpeed's JSON and a one-machine Accelerate file have none
    assert (printed["launch"] in path.read_text()) == has_launch  # the file's own launch line is the printed one
    if framework == "torchtitan":  # 0.3 imports the config as a module: its folder on PYTHONPATH, its stem
        assert f"PYTHONPATH='{new}'" in printed["launch"] and f"--module {path.stem} " in printed["launch"]
        assert main(["export", str(sweep_dir), "--to", framework, "--out", str(new / "mine.cfg")]) == 2
        assert "NAME.py" in capsys.readouterr().err and not (new / "mine.cfg").exists()
        assert main(["export", str(sweep_dir), "--to", framework, "--out", str(new / "mine.py")]) == 0
        assert "--module mine " in capsys.readouterr().out
        return
    assert f"'{path}'" in printed["launch"] and f" {printed['filename']}" not in printed["launch"]
    assert main(["export", str(sweep_dir), "--to", framework, "--out", str(new / "mine.cfg")]) == 0
    lines = capsys.readouterr().out.splitlines()
    launch = next(line for line in lines if line.startswith("launch with: "))  # after the runtime's price, if any
    assert lines[0] == f"wrote {new / 'mine.cfg'}" and f"'{new / 'mine.cfg'}'" in launch
    assert (launch.removeprefix("launch with: ") in (new / "mine.cfg").read_text()) == has_launch


def test_a_slash_after_an_existing_file_is_one_sentence(sweep_dir, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("mine")
    assert main(["export", str(sweep_dir), "--to", "deepspeed", "--out", f"{taken}/"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ends in a slash, which names a folder" in err[0] and taken.read_text() == "mine"
