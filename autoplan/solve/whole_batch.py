"""A model whose output couples the samples of a batch (``Graph.batch_coupled``, trace/batch_coupling.py: an
in-batch contrastive loss) is planned on whole batches: dp = 1 and one micro-batch (solve/space.py's
``whole_batch`` rule and ``micro_batch_options``); a pin that splits the batch is refused here in one sentence."""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.graph import Graph


def check_whole_batch_pins(graph: Graph, fixes: dict, *, batch: int) -> None:
    """A ``dp`` or ``mbs`` pin that splits the batch of a model whose output couples its samples: one sentence."""
    if not graph.batch_coupled:
        return
    split = fixes.get("dp", 1) > 1 or fixes.get("mbs", batch) < batch
    if split:
        pinned = ",".join(f"{key}={fixes[key]}" for key in ("dp", "mbs") if key in fixes)
        raise PlanError(
            f"--fix {pinned}: this model's output (shape {graph.batch_coupled}) couples the samples of a batch (an "
            "in-batch contrastive loss), and a batch split over data-parallel ranks or micro-batches trains another "
            "loss, each part scored against its own samples only; unpin them (autoplan keeps the batch whole: tp, "
            "pp, cp), or gather the embeddings across ranks in the model's loss."
        )
