"""How the seg tables and figures name and order models and name clip rules (from the model and
clip-rule registries; `dpmed.privacy.clipping.report_order` orders the rules)."""

from __future__ import annotations

from dpmed.models import MODELS, models_of_kind
from dpmed.privacy.clipping import CLIP_RULES

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


def clip_label(clip: str) -> str:
    """The display name of a clip rule ("AUTO-S")."""
    return CLIP_RULES[clip].label
