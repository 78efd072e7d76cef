"""The data passed between autoplan's stages. Imports no torch.distributed."""

from autoplan.types.cost import Cost
from autoplan.types.graph import OP_KINDS, PARAM_KINDS, Graph, GraphError, LayerGroup, OpNode, ParamInfo
from autoplan.types.plan import PLAN_SCHEMA_VERSION, PRECISIONS, RECOMPUTE, SCHEDULES, SPLITS, Plan
from autoplan.types.prediction import Prediction, SearchSummary
from autoplan.types.profile import (
    COLLECTIVES,
    DTYPES,
    CollectiveFit,
    DeviceSpec,
    Efficiency,
    LinkSpec,
    OpTiming,
    Profile,
)
from autoplan.types.reliability import ReliabilitySpec, StorageSpec
from autoplan.types.run import RunEstimate, RunSpec

__all__ = [
    "Cost",
    "Graph",
    "GraphError",
    "LayerGroup",
    "OpNode",
    "ParamInfo",
    "OP_KINDS",
    "PARAM_KINDS",
    "Plan",
    "Prediction",
    "RunSpec",
    "RunEstimate",
    "SearchSummary",
    "PLAN_SCHEMA_VERSION",
    "SCHEDULES",
    "RECOMPUTE",
    "PRECISIONS",
    "SPLITS",
    "Profile",
    "DeviceSpec",
    "Efficiency",
    "LinkSpec",
    "CollectiveFit",
    "OpTiming",
    "StorageSpec",
    "ReliabilitySpec",
    "COLLECTIVES",
    "DTYPES",
]
