"""An :class:`autoplan.report.explain.Explanation` as Markdown (console, ``explain.md``, report.md).

Every number comes from the explanation; the words only connect them.
"""

from __future__ import annotations

from autoplan.display import duration_text, number_text
from autoplan.report.trade import trade_lines

GIB = 2**30


def _rival_lines(exp) -> list[str]:
    lines = ["| rival | slower | deciding term | rival loses on | rival gains on |", "|---|---:|---|---|---|"]
    for r in exp.rivals:
        losses = ", ".join(f"{d.name} {duration_text(d.diff_s, signed=True)}" for d in r.diffs if d.diff_s > 0) or "-"
        gains = ", ".join(f"{d.name} {duration_text(d.diff_s)}" for d in r.diffs if d.diff_s < 0) or "-"
        term = f"{r.deciding.words}" if r.deciding else "tie"
        lines.append(f"| {r.plan} | {r.slower_pct:.2f}% | {term} | {losses} | {gains} |")
    return lines


def _decision(exp) -> str:
    """The nearest other family's verdict, word for word as the families table states it."""
    r = exp.decision_rival
    if r is None:
        return (
            f"**Decision:** no plan of another family was among those searched and fitting (the pins or the memory "
            f"left none), so the {exp.family} shape was the only option."
        )
    verdict = exp.family_verdict(r.family)
    if verdict.verdict == "tie":
        return f"**Decision:** the nearest other family, {r.family}, ties with it: {verdict.detail}."
    return f"**Decision: {verdict.verdict}.** The nearest other family, {r.family}, lost: {verdict.detail}."


def explanation_markdown(exp) -> str:
    """The whole explanation: every section of :func:`explanation_sections`, in order."""
    return "\n".join(line for lines in explanation_sections(exp).values() for line in lines) + "\n"


def explanation_sections(exp) -> dict[str, list[str]]:
    """The explanation's sections by name (why, change, families, trade, goodput), each its Markdown lines
    with its own heading; report.md and report.html both place them (autoplan/report/html.py)."""
    return {
        "why": _why_lines(exp),
        "change": _change_lines(exp),
        "families": _family_lines(exp),
        "trade": _trade_lines(exp),
        "goodput": ["", "## Checkpoints and failures", ""] + _goodput_lines(exp),
    }


def _why_lines(exp) -> list[str]:
    lines = [
        "## Why this plan",
        "",
        f"Chosen: **{exp.plan}**, {duration_text(exp.step_time_s)} per step, "
        f"{number_text(exp.peak_memory_bytes / GIB)} GiB peak per device (objective: {exp.objective}).",
        "",
        *(f"**Warning:** {w}\n" for w in exp.warnings),
        _decision(exp),
        "",
    ]
    if exp.ties:
        lines += [f"{len(exp.ties)} plan(s) tie with it on {exp.objective}:", ""] + [f"- {t}" for t in exp.ties] + [""]
    if exp.rivals:
        lines += ["Nearest rivals, term by term (rival minus chosen):", ""] + _rival_lines(exp) + [""]
    return lines


def _change_lines(exp) -> list[str]:
    lines = ["## What would change the decision", ""] + [f"- {t.sentence}" for t in exp.thresholds]
    if exp.memory:
        m = exp.memory
        lines.append(
            f"- memory headroom: {number_text(m['headroom_bytes'] / GIB)} GiB of "
            f"{number_text(m['usable_bytes'] / GIB)} GiB usable ({100 * m['headroom_fraction']:.1f}%); "
            f"the plan fits any device of {number_text(m['smallest_device_bytes'] / GIB)} GiB or more."
        )
    return lines


def _family_lines(exp) -> list[str]:
    lines = ["", "## Why each other family lost", "", "| family (dp, tp, pp) | verdict | why |", "|---|---|---|"]
    return lines + [f"| {f.family} | {f.verdict} | {f.detail} |" for f in exp.families]


#: the one-sentence notes after the trade table: (Explanation field, its lead-in or "" for none)
NOTES = (
    ("fp8", ""),
    ("attention", ""),
    ("frozen", "Frozen parameters"),
    ("sparse_grads", "Sparse embedding gradients"),
    ("cp", "Context parallelism"),
    ("hsdp", "HSDP"),
    ("local_sgd", "Local SGD"),
    ("experts", "Expert layout"),
    ("a2a_overlap", "All-to-all overlap"),
    ("recompute", "Recompute budget"),
    ("offload", "Offload"),
    ("zero_bubble", "Schedule"),
    ("activation_offload", "Activation offload"),
    ("compression", "Gradient compression"),
)


def _trade_lines(exp) -> list[str]:
    lines = ["", "## Precision and gradient sync: the trade", ""] + trade_lines(exp.trade)
    for name, lead in NOTES:
        if text := getattr(exp, name):
            lines += ["", f"**{lead}:** {text}" if lead else text]
    return lines


def _goodput_lines(exp) -> list[str]:
    """The checkpoint interval and expected goodput (autoplan/cost/run/reliability.py), or why not."""
    g = exp.goodput
    if not g:
        return [exp.goodput_note or "Checkpoint interval and goodput not priced."]
    steps = f"every {g['checkpoint_every_steps']} steps, " if g.get("checkpoint_every_steps") else ""
    return [
        f"- checkpoint: {g['checkpoint_bytes'] / 1e9:.4g} GB (fp32 weights and AdamW moments), "
        f"written in {g['checkpoint_write_s']:.3g} s, read in {g['checkpoint_read_s']:.3g} s",
        f"- job mean time between failures: {g['job_mtbf_s'] / 3600:.3g} h",
        f"- checkpoint interval minimising expected lost time (Daly 2006): {steps}{g['checkpoint_interval_s']:.4g} s",
        f"- expected goodput: {100 * g['expected_goodput']:.2f}% of wall time trains",
        "",
        "The checkpoint is the same size for every plan on these devices, so it does not change the ranking.",
    ]
