"""The screen a client's update passes before the xcal server averages it (`update_fault`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# The largest L2 norm of a client's update w_k − w_global (float64, over the whole model) the
# xcal server averages: orders of magnitude beyond any local round of DP-SGD or SGD at this
# project's learning rates, and far below float32's range (3.4e38), so a FedAvg of screened
# updates stays within it of the last global model. (fets' `MAX_UPDATE_NORM`, 1e100, guards
# float64 Gram matrices and would let a float32 model take 1e30 weights.)
MAX_UPDATE_NORM = 1e9


def update_fault(
    reference: Mapping[str, Any], tensors: Mapping[str, Any]
) -> tuple[str, str] | None:
    """(tensor, reason) of the first way the torch state dict `tensors` fails as an update of
    the model `reference`: a missing or extra key, another shape or dtype, a non-finite entry,
    or ‖tensors − reference‖ beyond `MAX_UPDATE_NORM` (naming its largest tensor); None when
    it passes."""
    import torch

    if missing := [k for k in reference if k not in tensors]:
        return missing[0], "missing"
    if extra := [k for k in tensors if k not in reference]:
        return extra[0], "not a tensor of the model"
    sq_norms = {}
    for name, ref in reference.items():
        value = tensors[name]
        if value.shape != ref.shape or value.dtype != ref.dtype:
            got, want = (tuple(value.shape), value.dtype), (tuple(ref.shape), ref.dtype)
            return name, f"shape and dtype {got}, the model's are {want}"
        if not bool(torch.isfinite(value).all()):
            return name, "non-finite entries"
        sq_norms[name] = float(torch.sum((value.double() - ref.double()) ** 2))
    norm = math.sqrt(sum(sq_norms.values()))
    if norm <= MAX_UPDATE_NORM:
        return None
    worst = max(sq_norms, key=sq_norms.__getitem__)
    return worst, f"update norm {norm:.3g} beyond the limit {MAX_UPDATE_NORM:.0e}"
