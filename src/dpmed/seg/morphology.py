"""DP-Morph variants (paper 002 §3): the registry of morphologies a seg job can apply to its
logits, the grammar of the `morph` wildcard, and what each variant needs of a dataset.

  none                    no morphology;
  <op>-k<k>               a fixed grey opening / closing / both (opening, then closing) with a
                          k×k kernel on every class;
  adaptive-vN[-qL-H][-s]  one operation per retinal layer from its thickness: thin layers are
                          closed, intermediate ones get both, thick ones the variant's operation
                          (v1 open, v2 both, v3 close). `-qL-H` sets the thickness quantiles
                          (else the configured ones); `-s` takes them per image (sound) instead
                          of over the batch (the paper's, which couples the images of a batch).

A light module (the rule file reads it at parse time): the tensor operations are in
`dpmed.seg.morph_ops`. A variant is one `MORPHS.add` here (a new fixed operation also needs
its function in `morph_ops.APPLY`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dpmed.data.registry import DATASET_REGISTRY
from dpmed.registry import Registry

MORPH_KINDS = ("none", "fixed", "adaptive")  # in report order
OPERATIONS = ("open", "close", "both")  # what a fixed variant or the adaptive policy applies
# The classes the adaptive policy measures: the scored retinal layers of Duke.
RETINAL_CLASSES: tuple[int, ...] = DATASET_REGISTRY["duke"].eval_classes
ADAPTIVE_KERNEL = 3
DEFAULT_QUANTILES = (20.0, 85.0)


@dataclass(frozen=True)
class Morph:
    """A registered DP-Morph variant.

    Args:
        kind: `none`, `fixed` (one operation on every class) or `adaptive` (an operation per
            retinal layer from its thickness).
        operation: fixed: its operation; adaptive: the operation of thick layers.
        kernels: the kernel sizes a fixed variant takes (wildcard `<name>-k<k>`).
        datasets: the seg datasets it can run on (None: all), and `why` not on the others.
    """

    kind: str
    operation: str | None = None
    kernels: tuple[int, ...] = ()
    datasets: tuple[str, ...] | None = None
    why: str = ""

    def pattern(self, name: str, groups: bool = False) -> str:
        """The regex of the `morph` wildcard values of variant `name` (with named groups k,
        low, high, sample for `parse_morph` when `groups`)."""
        if self.kind == "fixed":
            kernels = "|".join(str(k) for k in self.kernels)
            return rf"{name}-k(?P<k>{kernels})" if groups else rf"{name}-k(?:{kernels})"
        if self.kind == "adaptive":
            if groups:
                return rf"{name}(?:-q(?P<low>[0-9]+)-(?P<high>[0-9]+))?(?P<sample>-s)?"
            return rf"{name}(?:-q[0-9]+-[0-9]+)?(?:-s)?"
        return name


# The dataset whose classes 1–7 are the retinal layers the adaptive policy measures.
RETINAL_DATASET = "duke"
ADAPTIVE_NEEDS = f"adaptive DP-Morph needs the multi-class retinal layers of {RETINAL_DATASET}"

MORPHS: Registry[Morph] = Registry("morphology")
MORPHS.add("none", Morph("none"))
for _operation in OPERATIONS:
    MORPHS.add(_operation, Morph("fixed", _operation, kernels=(3, 5)))
# the operation of thick layers per adaptive variant (paper 002 §3.2)
for _version, _operation in (("v1", "open"), ("v2", "both"), ("v3", "close")):
    MORPHS.add(
        f"adaptive-{_version}",
        Morph("adaptive", _operation, datasets=(RETINAL_DATASET,), why=ADAPTIVE_NEEDS),
    )


def morph_pattern() -> str:
    """The regex of every `morph` wildcard value (Snakemake constraint and config schema)."""
    return "|".join(entry.pattern(name) for name, entry in MORPHS.items())


@dataclass(frozen=True)
class MorphSpec:
    """A parsed `morph` wildcard.

    Args:
        name: its registered variant.
        kind: the variant's kind (`none`, `fixed`, `adaptive`).
        op: fixed: the operation; adaptive: the operation of thick layers.
        k: the kernel size.
        quantiles: adaptive: the thickness quantiles (q_low, q_high) in percent.
        scope: adaptive: thresholds over the `batch` (the paper's) or per image (`sample`).
    """

    name: str
    kind: str
    op: str | None = None
    k: int = ADAPTIVE_KERNEL
    quantiles: tuple[float, float] = DEFAULT_QUANTILES
    scope: str = "batch"

    @property
    def label(self) -> str:
        """The wildcard without the adaptive options (`adaptive-v2-q25-80-s` → `adaptive-v2`)."""
        return f"{self.name}-k{self.k}" if self.kind == "fixed" else self.name

    @property
    def variant(self) -> str:
        """An adaptive variant's short name (`v2`); the label otherwise."""
        return self.name.removeprefix("adaptive-") if self.kind == "adaptive" else self.label


def _match(text: str) -> tuple[str, Morph, Mapping[str, str | None]]:
    """The registered variant spelling `text`, its entry and the pattern's groups; ValueError
    when no registered variant spells it."""
    for name, entry in MORPHS.items():
        match = re.fullmatch(entry.pattern(name, groups=True), text)
        if match:
            return name, entry, match.groupdict()
    raise ValueError(f"morph '{text}' is not one of: {morph_pattern()}")


def parse_morph(text: str, quantiles: tuple[float, float] = DEFAULT_QUANTILES) -> MorphSpec:
    """The `MorphSpec` of a `morph` wildcard; an adaptive `-qL-H` suffix overrides `quantiles`.

    Raises ValueError for a text no registered variant spells, or quantiles outside
    0 ≤ low ≤ high ≤ 100.
    """
    name, entry, groups = _match(text)
    if entry.kind == "none":
        return MorphSpec(name, "none")
    if entry.kind == "fixed":
        return MorphSpec(name, "fixed", entry.operation, int(groups["k"]))
    if groups["low"]:
        q = (float(groups["low"]), float(groups["high"]))
    else:
        q = (float(quantiles[0]), float(quantiles[1]))
    if not 0 <= q[0] <= q[1] <= 100:
        raise ValueError(
            f"morph '{text}': adaptive quantiles need 0 ≤ low ≤ high ≤ 100, "
            f"got low {q[0]:g}, high {q[1]:g}"
        )
    scope = "sample" if groups["sample"] else "batch"
    return MorphSpec(name, "adaptive", entry.operation, quantiles=q, scope=scope)


def morph_kind(morph: str) -> str:
    """The kind (`none`, `fixed`, `adaptive`) of a `morph` wildcard."""
    return _match(morph)[1].kind


def is_plain(morph: str) -> bool:
    """Whether a `morph` wildcard has none of the adaptive options (`-qL-H`, `-s`): a variant
    of the paper's main grid."""
    name, entry, _ = _match(morph)
    return entry.kind != "adaptive" or morph == name


def has_quantiles(morph: str) -> bool:
    """Whether a `morph` wildcard sets its own adaptive quantiles (`-qL-H`)."""
    return _match(morph)[2].get("low") is not None


def unsupported(morph: str, dataset: str) -> str | None:
    """Why `morph` cannot run on `dataset` (None when it can)."""
    name, entry, _ = _match(morph)
    if entry.datasets is not None and dataset not in entry.datasets:
        return entry.why or f"morph '{name}' runs on {', '.join(entry.datasets)} only"
    return None


def adaptive_variants() -> tuple[str, ...]:
    """The registered adaptive variants (`adaptive-v1`, ...), in registration order."""
    return tuple(name for name, entry in MORPHS.items() if entry.kind == "adaptive")
