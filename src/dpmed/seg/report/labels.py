"""How the seg tables and figures name and order datasets, models and clip rules: labels from
the dataset, model and clip-rule registries, the report orders of paper 002."""

from __future__ import annotations

from dpmed.data.registry import dataset_label
from dpmed.models import MODELS, models_of_kind
from dpmed.privacy.clipping import CLIP_RULES, report_order

__all__ = ["clip_label", "clip_order", "dataset_label", "model_label", "model_order"]

# The paper's model order (UNet++ first); other seg models follow in registry order.
PAPER_MODEL_ORDER = ("unetpp", "unet", "lfunet", "infnet")


def model_order() -> tuple[str, ...]:
    """The seg models in report order."""
    seg = models_of_kind("seg2d")
    return tuple(m for m in PAPER_MODEL_ORDER if m in seg) + tuple(
        m for m in seg if m not in PAPER_MODEL_ORDER
    )


def model_label(model: str) -> str:
    """The display name of a seg model ("UNet++")."""
    return MODELS[model].label


def clip_order() -> tuple[str, ...]:
    """The clip rules in report order (`ClipEntry.rank`)."""
    return report_order()


def clip_label(clip: str) -> str:
    """The display name of a clip rule ("AUTO-S")."""
    return CLIP_RULES[clip].label
