"""The pins that a model, profile or runtime cannot take, refused in one sentence before the search starts.

Each rule lives with its option (the modules named below); this is the list the search runs them in.
"""

from __future__ import annotations

from typing import Any

from autoplan.solve import activation_offload, moe_overlap, space
from autoplan.solve.context_parallel import check_cp_pins
from autoplan.solve.local_sgd import check_local_sgd_pins
from autoplan.solve.sparse_grads import check_sparse_pins
from autoplan.solve.whole_batch import check_whole_batch_pins
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile


def check_option_pins(graph: Graph, profile: Profile, fixes: dict, options: Any) -> None:
    """Lossy gradient sync and local SGD without --allow-lossy, context parallelism, activation offload, the
    all-to-all overlap and sparse embedding tables (their solve/ modules): raises PlanError for the first
    pin its rule refuses."""
    space.check_lossy_pins(graph, fixes, allow_lossy=options.allow_lossy)
    check_local_sgd_pins(fixes, allow_lossy=options.allow_lossy)
    check_cp_pins(graph, profile, fixes)
    activation_offload.check_activation_offload_pin(profile, fixes, options.runtime)
    moe_overlap.check_pin(fixes, options.runtime)
    check_sparse_pins(graph, fixes)
    check_whole_batch_pins(graph, fixes, batch=options.batch_size)
