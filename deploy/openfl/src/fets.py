"""The plan's templates (plan/plan.yaml): dpmed's FeTS data loader, task runner, assigner and
DP-SimAgg aggregation function (`dpmed.fets.openfl_components`). Importing this module also
makes OpenFL 1.9 run on NumPy >= 2.4 (`dpmed.fets.openfl_compat`); the aggregator and every
collaborator import it before they decompress a tensor."""

from dpmed.fets.openfl_compat import patch_numpy_reshape
from dpmed.fets.openfl_components import (
    DPSimAggregation,
    FetsAssigner,
    FetsDataLoader,
    FetsTaskRunner,
)

patch_numpy_reshape()

__all__ = ["DPSimAggregation", "FetsAssigner", "FetsDataLoader", "FetsTaskRunner"]
