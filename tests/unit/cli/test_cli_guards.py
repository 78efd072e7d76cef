"""One true sentence and exit 2 for inputs that used to surface late or under the wrong cause:
an --out that cannot be written (issue 29 item 7), a plan made for another model (item 6), a ZeRO
pin at dp=1 and no-fit suggestions that must themselves fit (item 7). No rank starts here."""

import json
import re
import shutil
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.types.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GPT, LLAMA = str(EXAMPLES / "gpt.py"), str(EXAMPLES / "llama.py")
SMALL_GPT = {"N_LAYER": "2", "N_EMBD": "32", "N_HEAD": "4", "VOCAB_SIZE": "128", "BLOCK_SIZE": "16"}


@pytest.fixture
def small_gpt(monkeypatch):
    for field, value in SMALL_GPT.items():
        monkeypatch.setenv(f"AUTOPLAN_GPT_{field}", value)
    return GPT


def _errors(capsys) -> list[str]:
    """stderr's lines other than warnings (a device-mismatch warning may precede the error)."""
    return [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("autoplan: warning:")]


def _one_sentence(capsys, *words: str) -> str:
    errors = _errors(capsys)
    assert len(errors) == 1 and errors[0].startswith("autoplan: error:"), errors
    assert "internal error" not in errors[0] and all(w in errors[0] for w in words), errors[0]
    return errors[0]


@pytest.fixture
def plan_dir(small_gpt, tmp_path):
    out = tmp_path / "gpt_plan"
    assert main(["plan", small_gpt, "--devices", "2", "--profile", "cpu-gloo", "--batch", "4", "--out", str(out)]) == 0
    return out


# ---- --out that cannot be written ----------------------------------------------------------
def _out_cases(plan: str, a_file: str, a_folder: str) -> dict[str, list[str]]:
    """Each command with --out, given an --out it cannot write (a file for a folder, a folder for a file,
    a path under a file)."""
    return {
        "plan": ["plan", GPT, "--devices", "2", "--profile", "cpu-gloo", "--batch", "4", "--out", a_file],
        "trace": ["trace", GPT, "--batch", "2", "--out", a_file],
        "run": ["run", GPT, "--plan", plan, "--out", a_file],
        "sweep": ["sweep", GPT, "--devices", "2", "--profile", "cpu-gloo", "--batch", "4", "--out", a_file],
        "report": ["report", plan, "--out", a_file],
        "replan": ["replan", plan, "--devices", "2", "--out", a_file],
        "calibrate": ["calibrate", plan, "--profile", "cpu-gloo", "--out", a_folder],
        "profile": ["profile", "--out", a_folder],
        "launch": ["launch", GPT, plan, "--slurm", "--out", a_folder],
        "export": ["export", plan, "--to", "torchtitan", "--out", f"{a_file}/config.toml"],
    }


@pytest.mark.parametrize(
    "command", ["plan", "trace", "run", "sweep", "report", "replan", "calibrate", "profile", "launch", "export"]
)
def test_an_out_that_cannot_be_written_is_one_sentence(small_gpt, tmp_path, capsys, command):
    a_file, a_folder = tmp_path / "taken.txt", tmp_path / "folder"
    a_file.write_text("")
    a_folder.mkdir()
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1).save(tmp_path / "plan.json")
    argv = _out_cases(str(plan), str(a_file), str(a_folder))[command]
    assert main(argv) == 2
    _one_sentence(capsys, "--out")
    assert a_file.read_text() == "" and not any(a_folder.iterdir())  # nothing written, nothing replaced


def test_a_path_the_file_system_refuses_is_one_sentence(small_gpt, tmp_path, capsys):
    """Not a bug of ours: the OS's reason, not 'internal error: OSError'."""
    too_long = tmp_path / ("x" * 300) / "trace"
    assert main(["trace", small_gpt, "--batch", "2", "--out", str(too_long)]) == 2
    _one_sentence(capsys, "cannot use", "File name too long")


# ---- a plan made for another model ---------------------------------------------------------
def test_plan_records_what_it_was_made_for(plan_dir):
    plan = json.loads((plan_dir / "plan.json").read_text())
    graph = json.loads((plan_dir / "graph.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", plan["model_sha256"]) and plan["model_sha256"] == graph["model_sha256"]
    assert re.fullmatch(r"[0-9a-f]{16}", plan["graph_signature"])


@pytest.mark.parametrize(
    "argv",
    [
        ["run", LLAMA, "--plan", "{plan}", "--out", "{tmp}/run"],
        ["launch", LLAMA, "{plan}", "--slurm", "--gpus-per-node", "2"],
        ["export", "{plan}", "--to", "torchtitan", "--model", LLAMA, "--out", "{tmp}/t.toml"],
    ],
    ids=["run", "launch", "export"],
)
def test_a_gpt_plan_given_to_a_llama_model_is_refused(plan_dir, tmp_path, capsys, argv):
    argv = [a.format(plan=plan_dir, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    _one_sentence(capsys, "was made for 'gpt'", "llama.py", "autoplan plan")
    assert not (tmp_path / "run").exists() and not (tmp_path / "t.toml").exists()
    assert not (plan_dir / "launch.sbatch").exists()


def test_the_same_file_at_other_sizes_is_refused(plan_dir, monkeypatch, capsys):
    monkeypatch.setenv("AUTOPLAN_GPT_N_LAYER", "3")
    assert main(["launch", GPT, str(plan_dir), "--slurm", "--gpus-per-node", "2"]) == 2
    _one_sentence(capsys, "other parameters", "AUTOPLAN_")


def test_an_edited_model_file_with_the_same_parameters_warns_and_goes_on(plan_dir, tmp_path, capsys):
    for name in ("gpt.py", "_gpt_common.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    edited = tmp_path / "gpt.py"
    edited.write_text(edited.read_text() + "\n# an edited comment\n")
    assert main(["launch", str(edited), str(plan_dir), "--slurm", "--gpus-per-node", "2"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "changed since" in line]
    assert len(warnings) == 1 and warnings[0].startswith("autoplan: warning: gpt.py changed since plan")
    assert (plan_dir / "launch.sbatch").is_file()


def test_a_plan_without_the_record_still_loads_and_is_not_checked(plan_dir, capsys):
    data = json.loads((plan_dir / "plan.json").read_text())
    del data["model_sha256"], data["graph_signature"]  # a plan.json written before plans recorded them
    (plan_dir / "plan.json").write_text(json.dumps(data))
    assert main(["launch", LLAMA, str(plan_dir), "--slurm", "--gpus-per-node", "2", "--quiet"]) == 0
    assert Plan.load(plan_dir / "plan.json").graph_signature == ""


def test_export_refuses_a_plan_beside_another_models_graph(plan_dir, tmp_path, capsys):
    other = tmp_path / "llama_plan"
    assert main(["plan", LLAMA, "--devices", "2", "--profile", "cpu-gloo", "--batch", "4", "--out", str(other)]) == 0
    shutil.copy(plan_dir / "plan.json", other / "plan.json")
    capsys.readouterr()
    assert main(["export", str(other), "--to", "megatron", "--out", str(tmp_path / "m.sh")]) == 2
    _one_sentence(capsys, "graph.json beside it")


# ---- ZeRO at dp=1, and suggestions that fit -------------------------------------------------
def _plan(model: str, devices: int, batch: int, fix: str, out: Path, profile: str = "dgx-a100") -> int:
    argv = ["plan", model, "--devices", str(devices), "--profile", profile, "--batch", str(batch), "--out", str(out)]
    return main([*argv, "--fix", fix, "--quiet"])


def test_zero_pinned_where_the_other_pins_leave_dp_1_names_the_rule(tmp_path, capsys):
    """tp=8, pp=4 on 32 devices leave dp=1: ZeRO has nothing to partition (it used to say 'no plan fits'
    while the same pins with zero=0 fit)."""
    assert _plan(GPT, 32, 32, "tp=8,pp=4,zero=1", tmp_path / "z1") == 2
    sentence = _one_sentence(capsys, "--fix zero=1", "data-parallel ranks", "dp=1", "zero=0")
    assert "no plan fits" not in sentence
    assert _plan(GPT, 32, 32, "tp=8,pp=4,zero=0", tmp_path / "z0") == 0


BIG_GPT = {"N_LAYER": "16", "N_EMBD": "8192", "N_HEAD": "64", "VOCAB_SIZE": "32000", "BLOCK_SIZE": "2048"}


@pytest.mark.parametrize("devices, words", [(4, "unpin recompute, zero, mbs: --fix "), (2, "would fit on 4 devices")])
def test_the_pins_a_no_fit_message_suggests_fit(monkeypatch, tmp_path, capsys, devices, words):
    """A 13B GPT with pinned memory choices: the message's --fix pins, planned as given, fit. Nothing is offloaded
    or split into schedule steps (dgx-a100 has a host section: offload, or k > 1 at pp > 1, would make the pinned
    plan fit)."""
    for field, value in BIG_GPT.items():
        monkeypatch.setenv(f"AUTOPLAN_GPT_{field}", value)
    pins = "recompute=none,zero=0,mbs=8,offload=none,offload_activations=off,schedule_steps=1"
    assert _plan(GPT, devices, 16, pins, tmp_path / "nofit") == 2
    sentence = _one_sentence(capsys, "no plan fits", words, "usable")
    suggested = re.search(r"--fix (\S+?)[ )]", sentence).group(1)
    fit_devices = int(re.search(r"on (\d+) devices", sentence.split("usable")[-1]).group(1))
    assert _plan(GPT, fit_devices, 16, suggested, tmp_path / "suggested") == 0
    best = Plan.load(tmp_path / "suggested" / "plan.json")
    assert best.predicted.peak_memory_bytes <= best.predicted.memory_capacity_bytes
