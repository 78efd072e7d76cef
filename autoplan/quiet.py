"""Known harmless lines of the libraries autoplan runs beside, silenced where they are emitted
(the lines, and why none concerns an autoplan run: docs/cli.md, "Only autoplan's lines").

A user should see only autoplan's lines. :func:`silence_known_noise` installs one narrow filter
per known line: a logging filter on the one logger that emits it, matched on its message (and
where it can be, on the library it concerns), or a ``warnings`` filter on its message and category.
Anything else those loggers and warnings say still shows. The entry points (``autoplan.cli.main``
and each rank, ``autoplan.execute.job.runner.main``, started by ``autoplan.cli.rank``) call it
first; it is idempotent. The lines: torchao's ``Failed to load ... .so``, torch's pytree note on
torchao's Enums, DTensor's CPU-mesh random-op and ``manual_seed()`` warnings, and torch's
``LeafSpec`` deprecation from pipelining's ``copyreg`` copies, and the fake-tensor logger's traceback of an op
that fails on fake tensors (the trace says which op, where and why in one sentence: trace/propagate.py).
"""

from __future__ import annotations

import logging
import warnings

#: Message starts of the torchao logger's lines that are dropped.
TORCHAO_PREFIXES = ("Failed to load ",)
#: What the ``torch.utils._pytree`` logger says about a registered Enum (format string).
PYTREE_ENUM_NOTE = "is an Enum subclass and is now natively supported by torch.compile"
#: DTensor's CPU-mesh RNG warnings (UserWarning), as regular expressions on the message start.
DTENSOR_RNG_WARNINGS = (
    r"DTensor random operators may not have complete support on cpu device mesh",
    r"DTensor manual_seed\(\) may not have complete support on cpu device mesh",
)

#: torch's deprecation of its own LeafSpec, when copy/pickle (``copyreg``) builds one.
LEAFSPEC_COPY = (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"copyreg")


class _TorchaoKernelNote(logging.Filter):
    """Drops torchao's "Failed to load ... .so" lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(TORCHAO_PREFIXES) and ".so" in message)


class _TorchaoEnumNote(logging.Filter):
    """Drops pytree's Enum deprecation note for torchao's enums only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if PYTREE_ENUM_NOTE not in str(record.msg):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and getattr(args[0], "__module__", "").startswith("torchao"))


#: What torch's fake-tensor logger says, with a traceback, before the failing op's exception reaches the tracer.
FAKE_META_FAILURE = "failed while attempting to run meta for"


class _FakeMetaFailure(logging.Filter):
    """Drops the fake-tensor logger's traceback of an op whose meta kernel failed: the exception goes on to the
    tracer, whose sentence names the op, the module and the error (a model given inputs of the wrong width)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(FAKE_META_FAILURE)


def _add_once(logger_name: str, kind: type[logging.Filter]) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def silence_known_noise() -> None:
    """Install the module docstring's filters (idempotent)."""
    _add_once("torchao", _TorchaoKernelNote)
    _add_once("torch.utils._pytree", _TorchaoEnumNote)
    _add_once("torch._subclasses.fake_tensor", _FakeMetaFailure)
    for message in DTENSOR_RNG_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    message, category, module = LEAFSPEC_COPY
    warnings.filterwarnings("ignore", message=message, category=category, module=module)
