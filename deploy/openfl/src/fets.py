"""The plan's templates (plan/plan.yaml): dpmed's FeTS aggregator, data loader, task runner,
assigner and DP-SimAgg aggregation function (`dpmed.fets.openfl_components`). Importing this
module also applies dpmed's changes to OpenFL 1.9 (`patch_openfl`: NumPy >= 2.4,
the `bind_addr` network setting, no shared port, a warning without TLS); the aggregator and
every collaborator import it before they serve or decompress a tensor."""

from dpmed.fets.openfl_components import (
    DPSimAggregation,
    FetsAggregator,
    FetsAssigner,
    FetsDataLoader,
    FetsTaskRunner,
    patch_openfl,
)

patch_openfl()

__all__ = ["DPSimAggregation", "FetsAggregator", "FetsAssigner", "FetsDataLoader",
           "FetsTaskRunner"]  # fmt: skip
