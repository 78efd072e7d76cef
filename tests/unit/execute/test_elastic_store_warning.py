"""--elastic under a user's torchrun warns, on rank 0, when the agents share their rendezvous store (torch's
default), where a node that joins a later round hangs every agent; and only there (docs/elastic.md)."""

from autoplan.execute.job.checkpointing import SHARED_STORE_OFF, shared_store_warning
from autoplan.jobs.lifeline import LAUNCHER_PID_ENV

SHARED = {"TORCHELASTIC_USE_AGENT_STORE": "True"}


def test_elastic_under_torchruns_shared_store_names_the_variable_that_turns_it_off():
    line = shared_store_warning(elastic=True, environ=SHARED)
    assert line is not None and f"{SHARED_STORE_OFF}=1" in line and line.count(".") >= 1


def test_no_warning_without_elastic_without_sharing_or_under_autoplans_own_launcher():
    assert shared_store_warning(elastic=False, environ=SHARED) is None
    assert shared_store_warning(elastic=True, environ={}) is None  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: False
    assert shared_store_warning(elastic=True, environ={"TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert shared_store_warning(elastic=True, environ={**SHARED, LAUNCHER_PID_ENV: "123"}) is None
