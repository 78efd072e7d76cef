"""jobs.environ.environment: the launch's and the calibration re-trace's temporary variables."""

import os

import pytest

from autoplan.jobs.environ import environment


def test_sets_inside_and_restores_old_values_and_absence_even_on_error(monkeypatch):
    monkeypatch.setenv("AUTOPLAN_TEST_KEPT", "old")
    monkeypatch.delenv("AUTOPLAN_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with environment([("AUTOPLAN_TEST_KEPT", "new"), ("AUTOPLAN_TEST_NEW", "1")]):
            assert os.environ["AUTOPLAN_TEST_KEPT"] == "new" and os.environ["AUTOPLAN_TEST_NEW"] == "1"
            raise RuntimeError("the launch failed")
    assert os.environ["AUTOPLAN_TEST_KEPT"] == "old"
    assert "AUTOPLAN_TEST_NEW" not in os.environ
