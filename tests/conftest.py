"""Puts tests/ on the import path, so every tier imports the one fixtures module, ``synthetic``."""

import os

import pytest

# The trace cache (autoplan/trace/cache.py) stays off in tests, so each test traces what it means to
# trace; tests/unit/trace/test_trace_cache.py turns it on in a temporary folder.
os.environ["AUTOPLAN_TRACE_CACHE"] = "off"

# pytest-xdist's workers start with COLUMNS=80, which the CLI takes for a terminal's width
# (solve/console.py); the tests read its tables as printed to a pipe (160 columns), as without xdist.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


# The multi-process test files of the second xdist group (the rest of tests/dist is the first): the two
# groups take about the same wall time, so on a 2-core machine each worker runs one beside the unit tests.
SECOND_DIST_GROUP = frozenset(
    f"test_{name}.py"
    for name in (
        "checkpoint", "checkpoint_api", "compression", "corpus_run", "expert_parallel", "gpu_check_cpu",
        "hf_models", "moe_a2a_overlap", "odd_models_run", "pipeline_output", "profile_measure",
        "tp_dropout_masks", "v_audit",
    )
)  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the README's ``-n auto --dist loadgroup``) the multi-process tests of tests/dist run
    in two groups, each on one worker, one test after another: two launches at a time keep a 2-core machine
    busy, where one left a core idle while the ranks waited on each other. A group's tests share process
    groups through session and module fixtures (the audits' files are in the first group together). The
    unit tests spread over the workers beside them. A multi-process test must therefore pass beside
    another launch: none may depend on the machine being idle (tests/dist/test_checkpoint.py's torchrun
    test waits on the job's own progress, not on time)."""
    multi_process = config.rootpath / "tests" / "dist"
    for item in items:
        if item.path.is_relative_to(multi_process):
            group = "dist_b" if item.path.name in SECOND_DIST_GROUP else "dist"
            item.add_marker(pytest.mark.xdist_group(group))
