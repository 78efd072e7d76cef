"""The search cache (autoplan/cost/stored.py): a search that reads the values an earlier one stored computes none
of them and finds the same plans and prices; its share processes send theirs back; a bad file is computed again, an
unwritable folder is one note, and the command line reads ``AUTOPLAN_SEARCH_CACHE`` and ``--no-search-cache``."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import stored
from autoplan.cost.pp.rank_memory import rank_floors
from autoplan.solve import shares
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types._check import write_text_atomic

ROOT = Path(__file__).resolve().parents[3]
#: a space with pipelines, on a device tight enough that their memory floors and peak states are read
GRAPH = synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=16)


def _search(jobs: int = 1):
    options = SearchOptions(devices=16, batch_size=GRAPH.batch_size, fixes={}, keep=1, jobs=jobs)
    return Search(GRAPH, synthetic_profile(memory_bytes=24 * 2**30), options).run()


def _rows(result) -> list[tuple]:
    return [(c.status, c.objective, c.lower_bound, c.reason, c.cost) for c in result.candidates]


def _searched(folder: Path, jobs: int = 1) -> tuple:
    """A search as a new process runs it (no value in memory), attached to ``folder``; with what it computed."""
    stored.clear_memos()
    with stored.attached(folder) as notes:
        result = _search(jobs)
        computed = sum(len(values) for values in stored.computed().values())
    assert notes == []
    return result, computed


def test_a_warm_cache_computes_nothing_and_prices_the_same(tmp_path):
    """The second search reads every value the first stored: it computes none, and its rows, best plan and price are
    the first's, and those of a search with no cache."""
    cold, computed_cold = _searched(tmp_path)
    warm, computed_warm = _searched(tmp_path)
    stored.clear_memos()
    uncached = _search()
    assert computed_cold > 100 and len(list(tmp_path.glob("*.pickle"))) == 1
    assert computed_warm == 0
    assert _rows(warm) == _rows(cold) == _rows(uncached)
    assert warm.best.describe() == cold.best.describe() == uncached.best.describe()


@pytest.mark.skipif(shares.usable_jobs(2) == 1, reason="the search forks only on Linux")
def test_the_shares_send_their_values_back(tmp_path, monkeypatch):
    """On 2 processes the values the child computed are saved too: a second search on 2 processes computes none in
    either process (the child's count read from what it sends its parent)."""
    sent = tmp_path / "child-computed"
    pickled = shares._pickled

    def counted(payload, share, jobs):  # in the child: how many values it computed, beside its rows
        sent.write_text(str(sum(len(values) for values in payload[-1].values())))
        return pickled(payload, share, jobs)

    monkeypatch.setattr(shares, "_pickled", counted)
    first, computed_first = _searched(tmp_path / "cache", jobs=2)
    child_first = int(sent.read_text())
    second, computed_second = _searched(tmp_path / "cache", jobs=2)
    assert first.processes == second.processes == 2
    assert child_first > 10 and computed_first > child_first  # the parent's own and the child's
    assert (computed_second, int(sent.read_text())) == (0, 0)
    assert _rows(second) == _rows(first)


class _Writes:
    """Pickles as a call of one of autoplan's functions: writing a file where it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return write_text_atomic, (str(self.path), "written by the cache file")


def test_a_bad_file_is_computed_again_and_written_over(tmp_path):
    """Garbage, a pickle that names a class not autoplan's, and one that calls an autoplan function, read as an empty
    cache (the function never called): the values are computed as without one, and the file is written again."""
    args = dict(schedule="1f1b", pp=4, virtual_stages=1, m=8, rank=1)
    stored.clear_memos()
    expected = rank_floors(**args)
    path, planted = tmp_path / f"{stored.code_digest()}.pickle", tmp_path / "planted.txt"
    foreign, calling = pickle.dumps({"x": {(): subprocess.Popen}}), pickle.dumps({"x": {(): _Writes(planted)}})
    for bad in (b"not a pickle", foreign, calling):
        path.write_bytes(bad)
        stored.clear_memos()
        with stored.attached(tmp_path) as notes:
            assert rank_floors(**args) == expected
        assert notes == []
        saved = pickle.loads(path.read_bytes())
        assert saved["autoplan.cost.pp.rank_memory.rank_floors"][((), tuple(sorted(args.items())))] == expected
    assert not planted.exists()


def test_the_folder_keeps_its_last_files(tmp_path):
    """Files of other code (older, here) are removed past KEPT_FILES, the newest kept, this search's among them."""
    for i in range(stored.KEPT_FILES + 2):
        old = tmp_path / f"old{i}.pickle"
        old.write_bytes(pickle.dumps({}))
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    stored.clear_memos()
    with stored.attached(tmp_path):
        rank_floors(schedule="1f1b", pp=4, virtual_stages=1, m=8, rank=3)
    kept = sorted(p.name for p in tmp_path.glob("*.pickle"))
    newest = [f"old{i}.pickle" for i in range(3, stored.KEPT_FILES + 2)]
    assert kept == sorted([f"{stored.code_digest()}.pickle", *newest])


def test_an_unwritable_folder_is_one_note(tmp_path):
    """A folder that is a file: the search goes on, and the note says which folder could not be written."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    stored.clear_memos()
    with stored.attached(blocked) as notes:
        rank_floors(schedule="1f1b", pp=4, virtual_stages=1, m=8, rank=2)
    assert len(notes) == 1 and "could not be written" in notes[0] and str(blocked) in notes[0]


def test_the_digest_names_the_code(monkeypatch):
    """Another autoplan version is another file: old values are never read by a changed cost model."""
    before = stored.code_digest()
    monkeypatch.setattr(stored, "__version__", "0.0.0-other")
    assert stored.code_digest() != before


def test_plan_reads_the_environment_and_the_flag(tmp_path):
    """``autoplan plan`` stores into AUTOPLAN_SEARCH_CACHE, and nothing with --no-search-cache."""
    on, off = tmp_path / "on", tmp_path / "off"
    command = [sys.executable, "-m", "autoplan.cli", "plan", str(ROOT / "examples/gpt.py"), "--devices", "8"]
    command += ["--profile", "dgx-a100", "--batch", "16", "--quiet"]
    for folder, extra in ((on, []), (off, ["--no-search-cache"])):
        env = {"AUTOPLAN_SEARCH_CACHE": str(folder), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        done = subprocess.run([*command, "--out", str(tmp_path / "out"), *extra], env=env, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()
    assert len(list(on.glob("*.pickle"))) == 1 and not off.exists()
