"""``autoplan run``'s options are declared once (autoplan/types/run_options.py): the command's
flags, the options a launched rank reads and a job file's ``autoplan run`` words all come from
RunOptions, with one default each, and a bad value is one sentence."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from autoplan.cli import main
from autoplan.errors import RunError
from autoplan.jobs.nodejob import executor_args
from autoplan.types.run_options import RunOptions, add_run_arguments

GIVEN = ["m.py", "--plan", "p.json", "--out", "r"]


def _parsed(*words: str) -> RunOptions:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return RunOptions.from_namespace(parser.parse_args([*GIVEN, *words]))


def test_every_flag_defaults_to_the_field_default():
    parsed = _parsed()
    assert parsed == RunOptions(model="m.py", plan="p.json", out="r")
    assert parsed.timeout_s == 45.0 and parsed.steps == 10 and parsed.max_restarts == 0


def test_a_rank_reads_back_every_option_the_command_parsed():
    parsed = _parsed(
        "--audit", "--seed", "3", "--timeout-s", "7.5", "--checkpoint-dir", "ck", "--checkpoint-every", "2"
    )
    assert RunOptions.from_json(parsed.to_json()) == parsed


def test_the_words_a_job_file_runs_parse_back_to_the_same_options():
    options = RunOptions(model="m.py", plan="p.json", out="r", steps=9, verify=True, checkpoint_dir="ck", seed=4)
    words = options.command_words()
    assert words[:2] == ("run", "m.py") and "--verify" in words and "--timeout-s" not in words
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert RunOptions.from_namespace(parser.parse_args(list(words[1:]))) == options
    assert executor_args(model="m.py", plan="p.json", steps=9, run_dir="r", checkpoint_dir="ck") == (
        "run", "m.py", "--plan", "p.json", "--steps", "9", "--out", "r", "--checkpoint-dir", "ck",
    )  # fmt: skip


def test_options_set_by_autoplan_are_no_flags():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    flags = {action.dest for action in parser._actions} - {"help"}
    assert flags == {f.name for f in fields(RunOptions)} - {"profile_threads"}


@pytest.mark.parametrize(
    "words, said",
    [
        (("--steps", "0"), "--steps 0: expected at least 1 step."),
        (("--checkpoint-every", "0"), "--checkpoint-every 0: expected at least 1 step."),
        (("--max-restarts", "-1"), "--max-restarts -1: expected 0 or more."),
        (("--timeout-s", "0"), "--timeout-s 0.0: expected a positive number of seconds."),
    ],
)
def test_a_bad_option_is_one_sentence_before_any_plan_is_read(words, said, tmp_path, capsys):
    argv = ["run", "missing.py", "--plan", str(tmp_path / "none.json"), "--out", str(tmp_path / "r"), *words]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"autoplan: error: {said}"


def test_options_a_rank_cannot_read_are_refused():
    with pytest.raises(RunError, match="unknown field 'timeout'"):
        RunOptions.from_json('{"model": "m.py", "plan": "p.json", "out": "r", "timeout": 3}')
