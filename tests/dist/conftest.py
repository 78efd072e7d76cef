"""The execution audit's runs, shared by tests/dist/test_audit.py and tests/dist/test_audit_mechanisms.py: every
case of tests/dist/audit_cases.py audited once a session, on one 2-rank and one 4-rank gloo group, made when the first
test that reads them asks (either file alone makes them; under xdist every tests/dist test runs on one worker,
tests/conftest.py)."""

from __future__ import annotations

import audit_cases as cases
import pytest
from exec_harness import run_audits


@pytest.fixture(scope="session")
def audits():
    two = cases.CASES + cases.RESHARDING + cases.FLOPS_ONLY + cases.SPARSE
    return {**run_audits(2, two), **run_audits(4, cases.FOUR)}


@pytest.fixture(scope="session")
def graphs():
    """The traced models by name, each case's priced side kept as it is asked for (audit_cases.priced_case)."""
    return cases.traced_models()
