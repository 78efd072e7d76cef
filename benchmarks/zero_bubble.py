"""Zero-bubble (ZB-H1, autoplan's ``interleaved_zb`` at v = 1) against 1F1B, priced by autoplan on the
zero-bubble paper's shapes (a check, not a fit).

Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024: GPT models of 1.5B, 6.2B, 14.6B and 28.3B
parameters (layers, heads, hidden: 22/24/2304, 30/32/4096, 46/40/5120, 62/48/6144; sequence 1024) trained
with pure pipeline parallelism over 8, 8, 16 and 32 A100 80GB GPUs, micro-batch 6, 3, 1, 1 and 3, 4 and 8
micro-batches per stage (the paper's Table 3; the parameter counts follow from those shapes,
12 L h^2 + the 50k-token embedding). The abstract's result: ZB-1p (its schedule with 1F1B's memory, ZB-H1's
automatic version) outperforms 1F1B by up to 23% in throughput.

autoplan prices each shape on the dgx-a100 profile (examples/gpt_megatron.py at the paper's sizes, bf16,
no recomputation, dp = tp = 1, the blocks split evenly), once with schedule 1f1b and once with
interleaved_zb, and prints the throughput ratio, the bubble of each and the peak memory of each; the
paper's per-run samples/s are not restated here (read them in its Table 4), so the check is the ratio's
range against the abstract's "up to 23%".

    python benchmarks/zero_bubble.py
"""

from __future__ import annotations

from pathlib import Path

from _results import write_results

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gpt_megatron.py"
#: name -> (layers, heads, hidden, pipeline stages (= GPUs), micro-batch size), Qi et al. ICLR'24 Table 3
SHAPES = {
    "1.5B": (22, 24, 2304, 8, 6),
    "6.2B": (30, 32, 4096, 8, 3),
    "14.6B": (46, 40, 5120, 16, 1),
    "28.3B": (62, 48, 6144, 32, 1),
}
MICROBATCHES_PER_STAGE = (3, 4, 8)  # m = 3p, 4p, 8p
SEQ_LEN, VOCAB = 1024, 50257


def _graph(layers: int, heads: int, hidden: int, mbs: int):
    from autoplan.calibrate.runs import environment
    from autoplan.trace import trace_model_file

    sizes = dict(N_LAYER=layers, N_HEAD=heads, N_EMBD=hidden, SEQ_LEN=SEQ_LEN, VOCAB_SIZE=VOCAB)
    with environment(tuple((f"AUTOPLAN_GPTM_{k}", str(v)) for k, v in sizes.items())):
        return trace_model_file(EXAMPLE, mbs)


def rows() -> list[dict]:
    from autoplan.cost import CostModel
    from autoplan.profile import load_profile
    from autoplan.types import Plan

    profile, out = load_profile("dgx-a100"), []
    for name, (layers, heads, hidden, pp, mbs) in SHAPES.items():
        model = CostModel(_graph(layers, heads, hidden, mbs), profile)
        for per_stage in MICROBATCHES_PER_STAGE:
            fields = dict(devices=pp, dp=1, tp=1, pp=pp, micro_batch_size=mbs, num_microbatches=per_stage * pp)
            base, zb = (
                model.estimate(Plan(**fields, precision="bf16", schedule=s)) for s in ("1f1b", "interleaved_zb")
            )
            out.append(
                dict(
                    model=name,
                    gpus=pp,
                    microbatches=per_stage * pp,
                    samples_per_s_1f1b=base.samples_per_s,
                    samples_per_s_zb_h1=zb.samples_per_s,
                    zb_h1_over_1f1b=zb.samples_per_s / base.samples_per_s,
                    bubble_s_1f1b=base.bubble_s,
                    bubble_s_zb_h1=zb.bubble_s,
                    peak_gib_1f1b=base.peak_memory_bytes / 2**30,
                    peak_gib_zb_h1=zb.peak_memory_bytes / 2**30,
                    fits=zb.feasible and base.feasible,
                )
            )
    return out


def main() -> None:
    table = rows()
    header = f"{'model':>6} {'gpus':>4} {'m':>4} {'1F1B s/s':>9} {'ZB-H1 s/s':>9} {'ratio':>6} {'bubble 1F1B':>11} "
    print(header + f"{'bubble ZB':>10} {'peak 1F1B':>10} {'peak ZB':>8}")
    for r in table:
        print(
            f"{r['model']:>6} {r['gpus']:>4} {r['microbatches']:>4} {r['samples_per_s_1f1b']:>9.2f} "
            f"{r['samples_per_s_zb_h1']:>9.2f} {r['zb_h1_over_1f1b']:>6.3f} {r['bubble_s_1f1b'] * 1e3:>9.1f}ms "
            f"{r['bubble_s_zb_h1'] * 1e3:>8.1f}ms {r['peak_gib_1f1b']:>8.1f}Gi {r['peak_gib_zb_h1']:>6.1f}Gi"
        )
    ratios = [r["zb_h1_over_1f1b"] for r in table]
    print(f"ZB-H1 / 1F1B throughput: {min(ratios):.3f} to {max(ratios):.3f} (paper's abstract: ZB-1p up to 1.23)")
    write_results(table, "zero_bubble")


if __name__ == "__main__":
    main()
