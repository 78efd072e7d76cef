"""Errors a user can act on.

Every stage raises :class:`AutoplanError` (or a subclass) for bad input, with one sentence
that says what was wrong and what to do. The CLI prints that sentence and exits non-zero;
it prints a traceback only with ``--debug``. ``assert`` is kept for our own invariants.
"""

#: set to "1" by ``autoplan --debug`` for the processes it starts: a rank then raises a refusal with its traceback
DEBUG_ENV = "AUTOPLAN_DEBUG"


class AutoplanError(ValueError):
    """Bad input from the user: a model file, a profile, a plan or a flag."""


class ModelFileError(AutoplanError):
    """The model file is missing, does not import, or breaks the contract."""


class TraceError(AutoplanError):
    """Neither torch.fx nor torch.export could trace the model."""


class ProfileError(AutoplanError):
    """A hardware profile has a bad field or cannot be found."""


class PlanError(AutoplanError):
    """A plan is invalid, or no plan fits the cluster."""


class RunError(AutoplanError):
    """A distributed run failed: a rank crashed, timed out or mismatched."""


class ExportError(AutoplanError):
    """A plan that cannot be exported to a trainer's config, or a config that cannot be read."""


class CheckpointError(AutoplanError):
    """A checkpoint is missing, corrupt, of another model, or of an incompatible autoplan version."""


class StopSignal(RunError):
    """``autoplan run`` was told to stop (SIGTERM, SIGHUP): every rank was ended; exits 128 + signal."""

    def __init__(self, signum: int, nprocs: int, hint: str = ""):
        import signal

        self.exit_code = 128 + signum
        after = hint or "this run wrote no results (rerun it to train)"
        super().__init__(f"stopped by {signal.Signals(signum).name}: all {nprocs} ranks were ended; {after}.")
