"""Budgeted recompute: which blocks of a pipeline chunk run the plan's recompute mode.

``Plan.recompute_blocks[c] = k`` recomputes the FIRST ``k`` blocks of chunk ``c`` of ``Plan.stages``
(``pp * virtual_stages`` chunks, chunk ``c`` on stage ``c % pp``: types/layout.py) under
``Plan.recompute`` ("full" or "selective") and keeps the others' activations whole, as Megatron-LM's
``--recompute-method block --recompute-num-layers k`` does per pipeline chunk (its TransformerBlock,
one per virtual stage). ``[]`` recomputes every block of every chunk, the behaviour of plans without
the field. The cost model, the search, the executor, the audit and the exporters all read this one
rule (docs/plan-format.md, "Budgeted recompute").
"""

from __future__ import annotations

from collections.abc import Sequence

from autoplan.errors import PlanError


def check_recompute_blocks(*, recompute: str, recompute_blocks: list, chunks: int, stages: list[list[str]]) -> None:
    """Raise PlanError unless ``recompute_blocks`` is [] or one count per chunk, each between 0 and the
    chunk's block count (checked here when ``stages`` lists the chunks, else by the cost model against
    the graph's blocks), and empty under ``recompute="none"``."""
    if not isinstance(recompute_blocks, list):
        raise PlanError(f"plan recompute_blocks={recompute_blocks!r}; expected a list of block counts.")
    if not recompute_blocks:
        return
    if recompute == "none":
        raise PlanError(
            f"plan recompute_blocks={recompute_blocks} with recompute='none': the counts say how many blocks run "
            "'full' or 'selective' recompute; use recompute_blocks [] or set recompute."
        )
    if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in recompute_blocks):
        raise PlanError(f"plan recompute_blocks={recompute_blocks}; expected integers >= 0, one per pipeline chunk.")
    if len(recompute_blocks) != chunks:
        raise PlanError(
            f"plan recompute_blocks has {len(recompute_blocks)} entries; expected one per pipeline chunk, "
            f"pp*virtual_stages = {chunks}."
        )
    if stages:
        check_counts_fit(recompute_blocks, [len(chunk) for chunk in stages])


def check_counts_fit(recompute_blocks: Sequence[int], chunk_sizes: Sequence[int]) -> None:
    """Raise PlanError when a chunk is asked to recompute more blocks than it runs."""
    for index, (k, size) in enumerate(zip(recompute_blocks, chunk_sizes)):
        if k > size:
            raise PlanError(
                f"plan recompute_blocks[{index}]={k} but pipeline chunk {index} runs {size} blocks; use at most {size}."
            )


def recomputed_counts(*, recompute: str, recompute_blocks: Sequence[int], chunk_sizes: Sequence[int]) -> list[int]:
    """How many leading blocks of each chunk recompute: none without recompute, every block with
    ``recompute_blocks`` empty, else the counts."""
    if recompute == "none":
        return [0] * len(chunk_sizes)
    if not recompute_blocks:
        return list(chunk_sizes)
    check_counts_fit(recompute_blocks, chunk_sizes)
    return list(recompute_blocks)


def recomputed_blocks(*, recompute: str, recompute_blocks: Sequence[int], chunks: Sequence[Sequence[str]]) -> list[str]:
    """The blocks (by FQN) that run ``recompute``: the first k of each chunk."""
    counts = recomputed_counts(
        recompute=recompute, recompute_blocks=recompute_blocks, chunk_sizes=[len(c) for c in chunks]
    )
    return [block for chunk, k in zip(chunks, counts) for block in list(chunk)[:k]]


def describe_counts(recompute: str, recompute_blocks: Sequence[int]) -> str:
    """The plan's recompute as a summary shows it: ``full``, or ``full:2/1`` under a budget."""
    return f"{recompute}:{'/'.join(str(k) for k in recompute_blocks)}" if recompute_blocks else recompute
