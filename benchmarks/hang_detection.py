"""How long `autoplan run` takes to stop a job with a hung rank: the heartbeat against the collective timeout.

Rank 1 of a 2-rank ZeRO-1 run (a 4x4 Linear, gloo) sleeps for good in step 3's forward; the model file
writes the time it started sleeping. Measured: from then to the end of `autoplan run` (the launcher's
exit), with the heartbeat (--hang-timeout-s 10, the default) and without it (--hang-timeout-s 0: the
45 s process-group timeout alone, as before the heartbeat), alternating, so machine load hits both
alike. Prints each run and writes benchmarks/results/hang_detection.csv (docs/executor.md, "Hung ranks").

    python benchmarks/hang_detection.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = """
import os, time, torch, torch.distributed as dist
from pathlib import Path

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        if dist.get_rank() == 1 and self.calls == 4:  # step 3's forward
            Path(os.environ["HANG_AT"]).write_text(repr(time.time()))
            time.sleep(3600)
        return self.lin(x)

def build_model():
    return Net()

def example_inputs(batch_size):
    return (torch.randn(batch_size, 4),)
"""
MODES = {"heartbeat": "10", "collective timeout only": "0"}  # --hang-timeout-s


def once(hang_timeout_s: str) -> tuple[float, str]:
    """Seconds from rank 1's hang to the launcher's exit, and the error line it printed."""
    from autoplan.types.plan import Plan

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        (tmp / "model.py").write_text(MODEL)
        plan = Plan(devices=2, dp=2, tp=1, pp=1, zero_stage=1, micro_batch_size=1, num_microbatches=1)
        plan_file = plan.save(tmp / "plan.json")
        run = ["run", str(tmp / "model.py"), "--plan", str(plan_file), "--out", str(tmp / "run"), "--steps", "1000"]
        flags = ["--threads", "1", "--hang-timeout-s", hang_timeout_s]
        env = dict(os.environ, HANG_AT=str(tmp / "hang_at"), PYTHONPATH=str(ROOT))
        proc = subprocess.run(
            [sys.executable, "-m", "autoplan.cli", *run, *flags], env=env, capture_output=True, text=True
        )
        ended = time.time()
        errors = [line for line in proc.stderr.splitlines() if line.startswith("autoplan: error:")]
        return ended - float((tmp / "hang_at").read_text()), errors[0] if errors else proc.stderr[-300:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for repeat in range(args.repeats):
        for mode, hang_timeout_s in MODES.items():
            seconds, error = once(hang_timeout_s)
            cause = "heartbeat" if error.startswith("autoplan: error: hung:") else "collective timeout"
            row = {"mode": mode, "repeat": repeat, "hang_timeout_s": hang_timeout_s, "cause": cause}
            rows.append({**row, "stopped_after_s": round(seconds, 2)})
            print(f"{mode}: stopped {seconds:.1f} s after the hang ({cause}): {error[:160]}", flush=True)
    for mode in MODES:
        median = statistics.median(r["stopped_after_s"] for r in rows if r["mode"] == mode)
        print(f"{mode}: median {median:.1f} s")
    out = ROOT / "benchmarks/results/hang_detection.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
