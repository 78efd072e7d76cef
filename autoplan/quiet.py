"""Known harmless lines of the libraries autoplan runs beside, silenced where they are emitted.

A user should see only autoplan's lines. :func:`silence_known_noise` installs one narrow filter
per known line: a logging filter on the one logger that emits it, matched on its message (and
where it can be, on the library it concerns), or a ``warnings`` filter on its message and category.
Anything else those loggers and warnings say still shows. The entry points (``autoplan.cli.main``
and each rank, ``autoplan.execute.job.runner.main``, started by ``autoplan.cli.rank``) call it first; it is idempotent.

The lines, and why none concerns an autoplan run:

- torchao logs ``Failed to load .../torchao/_C*.so: ...`` (``torchao/__init__.py``, logger
  ``torchao``) for optional CUDA kernels this machine cannot load. Hugging Face transformers
  imports torchao whenever a model class loads (its quantizers), FP8 plan or not; autoplan's own
  FP8 path imports it only for FP8 plans (execute/float8.py), and float8 training does not use
  those kernels.
- ``torch.utils._pytree`` logs ``<enum ...> is an Enum subclass and is now natively supported by
  torch.compile ...`` when torchao registers its enums with ``register_constant`` (deprecated in
  torch 2.13): a note to torchao's authors. Only torchao's enums are matched.
- DTensor warns ``DTensor random operators may not have complete support on cpu device mesh``
  (``torch/distributed/tensor/_random.py``) on the first random op (dropout) of a CPU mesh, and
  ``DTensor manual_seed() may not have complete support`` likewise: DTensor's RNG tracker runs
  only on CUDA-like devices, so on CPU a random op draws from each rank's own generator, which
  the runner seeds alike on every rank before each step (docs/executor.md says what that means
  for dropout under tensor parallelism).
- torch 2.13 deprecates its own ``LeafSpec`` class with a FutureWarning on construction, and
  torch.distributed.pipelining deep-copies tree specs holding them when it splits a model: the
  warning (``isinstance(treespec, LeafSpec)` is deprecated``) then comes from ``copyreg``, torch
  copying its own objects. Only that origin is matched.
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


def _add_once(logger_name: str, kind: type[logging.Filter]) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def silence_known_noise() -> None:
    """Install the module docstring's filters (idempotent)."""
    _add_once("torchao", _TorchaoKernelNote)
    _add_once("torch.utils._pytree", _TorchaoEnumNote)
    for message in DTENSOR_RNG_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    message, category, module = LEAFSPEC_COPY
    warnings.filterwarnings("ignore", message=message, category=category, module=module)
