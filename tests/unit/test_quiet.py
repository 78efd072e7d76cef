"""autoplan/quiet.py drops exactly the known harmless library lines (issue 29 item 8), and autoplan's
own modules never import torchao for a plan without FP8."""

import enum
import logging
import subprocess
import sys
import warnings

import pytest

from autoplan.quiet import silence_known_noise


@pytest.fixture
def silenced():
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree", "torch._subclasses.fake_tensor")]
    before = [list(logger.filters) for logger in loggers]
    with warnings.catch_warnings():
        silence_known_noise()
        silence_known_noise()  # idempotent
        yield
    for logger, filters in zip(loggers, before):
        logger.filters[:] = filters


def _shown(logger: str, msg: str, *args) -> bool:
    record = logging.getLogger(logger).makeRecord(logger, logging.WARNING, __file__, 1, msg, args, None)
    return bool(logging.getLogger(logger).filter(record))


class TorchaoLike(enum.Enum):
    A = 1


TorchaoLike.__module__ = "torchao.float8.config"


class Users(enum.Enum):
    B = 2


def test_only_the_known_lines_are_dropped(silenced):
    assert not _shown("torchao", "Failed to load /site-packages/torchao/_C_mxfp8.so: Could not load this library")
    assert _shown("torchao", "Failed to load your checkpoint")  # not a kernel library: shown
    assert _shown("torchao", "some other torchao warning")
    note = "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type."
    assert not _shown("torch.utils._pytree", note, TorchaoLike)
    assert _shown("torch.utils._pytree", note, Users)  # the user's own enum: shown
    assert len(logging.getLogger("torchao").filters) == len(set(map(type, logging.getLogger("torchao").filters)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_known_noise()
        warnings.warn("DTensor random operators may not have complete support on cpu device mesh", UserWarning)
        warnings.warn("DTensor random operators are great", UserWarning)
        warnings.warn("some user warning", UserWarning)
    assert [str(w.message) for w in caught] == ["DTensor random operators are great", "some user warning"]


def test_the_executor_and_the_commands_import_no_torchao():
    code = (
        "import sys, autoplan.cli, autoplan.execute.api, autoplan.execute.job.runner, autoplan.execute.float8\n"
        "from autoplan.cli import build_parser; build_parser()\n"
        "print('torchao' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]


def test_the_fake_tensor_loggers_traceback_of_a_failing_op_is_dropped_and_its_other_lines_shown(silenced):
    """A model given inputs of the wrong width printed 19 lines of traceback before the tracer's one sentence."""
    assert not _shown("torch._subclasses.fake_tensor", "failed while attempting to run meta for %s", "aten.mm.default")
    assert _shown("torch._subclasses.fake_tensor", "some other fake tensor line")
