"""A rank forked from the launcher (autoplan/jobs/forked.py) behaves as ``python -m MODULE ARGS`` started
fresh: its environment is the one given, its stderr comes through the pipe the launcher reads, its exit
status (sys.exit, an exception, a signal) is Popen's, the launcher's stop-signal handlers are not its
own, and nothing after the fork in the launcher's frame runs in it."""

from __future__ import annotations

import signal
import sys

import pytest

from autoplan.jobs.forked import ForkedRank

MODULE = """
import os, sys, time
print("argv", sys.argv[1:], "env", os.environ.get("FORKED_X"), "home", os.environ.get("HOME"), file=sys.stderr)
what = sys.argv[1]
if what == "exit":
    sys.exit(3)
if what == "raise":
    raise ValueError("bad rank")
if what == "sleep":
    print("ready", file=sys.stderr, flush=True)
    time.sleep(60)
"""


@pytest.fixture()
def module(tmp_path, monkeypatch):
    (tmp_path / "forked_probe.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "forked_probe"


def _fork(module: str, what: str, tmp_path) -> ForkedRank:
    """Fork, and mark in the launcher's frame what runs after: a child that returned here would mark twice."""
    try:
        return ForkedRank(module=module, args=[what], env={"FORKED_X": "7"})
    finally:
        with (tmp_path / "after_fork").open("a") as marks:
            marks.write("x")


def test_the_child_runs_the_module_with_its_arguments_and_environment_and_returns_its_exit(module, tmp_path):
    rank = _fork(module, "exit", tmp_path)
    assert rank.wait(timeout=60) == 3 and rank.poll() == 3
    said = rank.stderr.read()
    assert "argv ['exit'] env 7 home None" in said, said
    assert (tmp_path / "after_fork").read_text() == "x"


def test_an_exception_is_a_traceback_on_stderr_and_exit_1(module, tmp_path):
    rank = _fork(module, "raise", tmp_path)
    assert rank.wait(timeout=60) == 1
    said = rank.stderr.read()
    assert "Traceback" in said and "ValueError: bad rank" in said, said
    assert (tmp_path / "after_fork").read_text() == "x"


def test_the_launchers_stop_handler_is_not_the_childs(module, tmp_path):
    """The launcher raises on SIGTERM (jobs/launcher.py _stop_signals_raise); its rank dies of it."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(99))
    try:
        rank = _fork(module, "sleep", tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert rank.stderr.readline().startswith("argv") and rank.stderr.readline() == "ready\n"
    assert rank.poll() is None
    rank.terminate()
    assert rank.wait(timeout=60) == -signal.SIGTERM
    rank.kill()  # after its exit: nothing to signal, no error
