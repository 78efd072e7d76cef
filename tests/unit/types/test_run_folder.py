"""The run folder has one writer (the executor's outputs) and one reader, which report and calibrate share."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from autoplan.calibrate.runs import CalibrationError, read_run_folder
from autoplan.execute.job.outputs import write_outputs
from autoplan.report.folder import ReportError, load_run_folder
from autoplan.types.plan import Plan
from autoplan.types.run_folder import MEASURED_COLUMNS, RunFolder

STEPS = [(0, 0.5, 4.0, 2048), (1, 0.25, 3.5, 4096), (2, 0.2500004, 3.25, 1024)]


@pytest.fixture
def written(tmp_path):
    model = tmp_path / "tiny.py"
    model.write_text("")
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=4, num_microbatches=1, model="tiny", profile="cpu-gloo")
    plan.save(tmp_path / "plan.json")
    rows = [dict(zip(MEASURED_COLUMNS, step)) for step in STEPS]
    opts = SimpleNamespace(out=str(tmp_path / "run"), model=str(model), plan=str(tmp_path / "plan.json"))
    write_outputs(opts=opts, plan=plan, rows=rows, verified=None)
    return tmp_path / "run", plan


def test_what_the_executor_writes_report_and_calibrate_read(written):
    folder, plan = written
    run = load_run_folder(folder)
    assert tuple(run.measured.columns) == MEASURED_COLUMNS and run.audit is None
    assert run.measured["step_time_s"].tolist() == [0.5, 0.25, 0.25]  # to the microsecond
    median_s = (0.25 + 0.2500004) / 2  # after one warm-up step, of the times as measured
    assert run.summary.median_step_time_s == median_s and run.summary.peak_memory_bytes == 4096
    assert run.plan_path() == folder / "plan.json" and Plan.load(run.plan_path()) == plan
    calibration = read_run_folder(folder)
    assert calibration.plan == plan and calibration.global_batch_size == plan.global_batch_size
    assert calibration.measured_step_time_s == median_s and calibration.noise_sigma is None  # 2 timed steps


SUMMARY_KEYS = (
    "plan model devices backend threads_per_process steps warmup_steps median_step_time_s predicted_step_time_s "
    "measured_over_predicted final_loss peak_memory_bytes peak_memory_kind verify model_file plan_file "
    "global_batch_size environment"
).split()


def test_summary_json_keeps_its_keys_and_order(written, tmp_path):
    folder, plan = written
    assert list(json.loads((folder / "summary.json").read_text())) == SUMMARY_KEYS
    rows = [dict(zip(MEASURED_COLUMNS, (0, 0.5, float("nan"), 1)))]
    opts = SimpleNamespace(out=str(tmp_path / "stopped"), model="m.py", plan="p.json")
    write_outputs(opts=opts, plan=plan, rows=rows, verified=None, nonfinite={"step": 0, "loss": "nan"})
    stopped = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert list(stopped) == [*SUMMARY_KEYS, "nonfinite_loss"] and stopped["final_loss"] is None
    old = tmp_path / "old"  # a folder of an older autoplan: fewer keys, one it no longer writes
    old.mkdir()
    (old / "summary.json").write_text('{"median_step_time_s": 0.3, "environment": null, "gone": 1}')
    summary = RunFolder.read(old, error=ReportError).summary
    assert summary.median_step_time_s == 0.3 and summary.environment == {} and summary.model_file is None


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (lambda f: (f / "summary.json").unlink(), "has no summary.json"),
        (lambda f: (f / "summary.json").write_text("{"), "is not valid JSON"),
        (lambda f: (f / "summary.json").write_text("[]"), "is not a JSON object"),
        (lambda f: (f / "measured.csv").write_text('a,"b\n'), "is not a readable CSV"),
    ],
)
def test_each_stage_gets_its_own_error_in_one_sentence(written, broken, expected):
    folder, _ = written
    broken(folder)
    for error, read in ((ReportError, load_run_folder), (CalibrationError, read_run_folder)):
        with pytest.raises(error, match=expected) as info:
            read(folder)
        assert "\n" not in str(info.value)


def test_a_folder_that_is_not_there(tmp_path):
    with pytest.raises(ReportError, match="does not exist"):
        RunFolder.read(tmp_path / "nope", error=ReportError)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    with pytest.raises(ReportError, match="measured.csv' does not exist"):  # the report plots the steps
        load_run_folder(tmp_path / "run")
    assert RunFolder.read(tmp_path / "run", error=ReportError).plan_path() is None
