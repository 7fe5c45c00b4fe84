"""Distinct cells of a grid: the jobs that cost the same per step, probed once.

A job's cost per step and its memory depend on what it builds and runs, not on its seed or
its learning rate, and its privacy budget ε changes only the noise multiplier σ (a scalar):
the tensors, their shapes and the code path are the same at every finite ε. So jobs are
grouped by a *shape key* (`shape_key`) and one representative per group is timed and
memory-probed; σ is still calibrated for every distinct ε of the group (`Cell.eps`). What the
key keeps, per study:

- seg: dataset (input size, images, classes), model and its architecture (width, depth, deep
  supervision), batch size, clip rule (non-private, or which per-sample rule), DP-Morph kind
  (none, fixed operation, adaptive over the batch or per image: different code and cost).
  Dropped: seed, ε (σ only), morph kernel/quantiles, lr and C (a sweep's axes), epochs (they
  multiply the steps, not the cost of one: the cost projection reads each job's own epochs).
- fets: the aggregator and DP mode (the server's rule), the participation (how many updates
  the server holds), private or not, the network (base filters, depth, norm), patch and batch
  size. Dropped: seed, ε0, rounds.
- xcal: dataset, model and width, method (its step and noise code), shift, client count (the
  data each client holds), private or not, batch size. Dropped: seed, ε, rounds.

Each cell keeps its own rows: σ calibrated for its ε, its own requests checked. Cells that
differ only in scalars of the same computation share one probe (`probe_key`): the private seg
clip rules (each scales the B per-sample norms by its own elementwise s(n) before the same
sum), the XCal-FL presets (weights of the same signal components) and the xcal shift and
client count (which partition the data without changing one client's step, a Poisson batch of
the same expected size, or the data the job holds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpmed.config.grid import Grid, Job
from dpmed.config.wildcards import parse_eps
from dpmed.seg.spec import attacked

CELL_FILE = "cell.json"  # per probed cell, in the preflight's logs/<index>/ folder
# The job_cost rules each study's cells are priced under (seg jobs are trained then attacked).
STUDY_RULES: dict[str, tuple[str, ...]] = {
    "seg": ("seg_train", "seg_attack"),
    "fets": ("fets_train",),
    "xcal": ("xcal_train",),
}
SEG_ARCHITECTURE = (
    "width",
    "depth",
    "deep_supervision",
    "batch_size",
    "physical_batch",
    "grad_sample_mode",
)
FETS_COLLABORATOR = ("base_filters", "depth", "norm", "patch_size", "batch_size")
FETS_NETWORK = (*FETS_COLLABORATOR, "participation")
XCAL_NETWORK = ("width_scale", "batch_size", "clients_per_round")


def _frozen(value: Any) -> Any:
    """A hashable copy of a params value (lists become tuples)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _morph_kind(morph: str) -> str:
    """`none`, `fixed`, `adaptive-batch` or `adaptive-sample` (the paper's batch thresholds or
    the per-image ones, suffix `-s`)."""
    from dpmed.seg.morphology import parse_morph

    spec = parse_morph(morph, (20.0, 85.0))
    return f"adaptive-{spec.scope}" if spec.kind == "adaptive" else spec.kind


def shape_key(study: str, wildcards: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """The key of jobs that build the same tensors and run the same code (module docstring)."""
    private = math.isfinite(parse_eps(wildcards["eps"]))
    if study == "seg":
        from dpmed.seg.spec import clip_rule

        rule = clip_rule(wildcards["clip"]) if private else "none"
        arch = tuple((k, _frozen(params[k])) for k in SEG_ARCHITECTURE if k in params)
        return ("seg", wildcards["dataset"], wildcards["model"], rule,
                _morph_kind(wildcards["morph"]), arch)  # fmt: skip
    if study == "fets":
        from dpmed.fets.spec import aggregator_name

        net = tuple((k, _frozen(params[k])) for k in FETS_NETWORK)
        return ("fets", aggregator_name(wildcards["aggregator"]), wildcards["dpmode"], private, net)
    if study == "xcal":
        net = tuple((k, _frozen(params[k])) for k in XCAL_NETWORK)
        axes = ("dataset", "model", "method", "shift", "clients")
        return ("xcal", *(wildcards[k] for k in axes), private, net)
    raise ValueError(f"unknown study {study!r}")


def probe_key(cell: Cell) -> tuple:
    """The key of cells one probe measures (module docstring): the shape key with the private
    seg clip rule, the xcal preset, shift and client count dropped."""
    if cell.study == "seg":
        _, dataset, model, rule, morph, arch = cell.key
        return ("seg", dataset, model, rule != "none", morph, arch)
    if cell.study == "xcal":
        from dpmed.xcal.methods import split_method

        _, dataset, model, method, _, _, private, net = cell.key
        return ("xcal", dataset, model, split_method(method)[0], private, net)
    return cell.key


def collaborator_key(cell: Cell) -> tuple:
    """What a fets collaborator's training and validation depend on: the network, patch and
    batch size. The server's rule, its DP mode, ε0 and the participation do not enter, so
    every fets cell of one network shares one collaborator-side probe."""
    return tuple((k, _frozen(cell.job.params[k])) for k in FETS_COLLABORATOR)


def evaluation_key(cell: Cell) -> tuple:
    """What an xcal run's test evaluation and ROAD depend on: the dataset (its test set), the
    network and the ROAD settings; not the method, shift, clients or ε (they change the
    weights, not the work of a forward pass or of Grad-CAM)."""
    params = cell.job.params
    return (cell.job.wc["dataset"], cell.job.wc["model"], _frozen(params["width_scale"]),
            _frozen(params["road_subsample"]), _frozen(params["road_percentages"]))  # fmt: skip


@dataclass
class Cell:
    """One distinct cell: its representative job (the first in grid order), every job it
    stands for and the distinct finite ε of those jobs (each gets its own σ)."""

    study: str
    key: tuple
    job: Job
    jobs: list[Job] = field(default_factory=list)

    @property
    def name(self) -> str:
        """A readable id, unique in a grid: the representative's wildcards without seed and ε,
        and `/nonprivate` for a cell of ε = inf (xcal's centralized cells differ in nothing
        else)."""
        wc = {k: v for k, v in self.job.wc.items() if k not in ("seed", "eps")}
        private = any(math.isfinite(eps) for eps in self.eps)
        return f"{self.study}/" + "/".join(wc.values()) + ("" if private else "/nonprivate")

    @property
    def eps(self) -> list[float]:
        """The distinct ε of the cell's jobs, ascending (inf for a non-private cell)."""
        return sorted({parse_eps(job.wc["eps"]) for job in self.jobs})


def rule_jobs(cell: Cell, rule: str) -> list[Job]:
    """The jobs of `cell` that run `rule`: all of them, but seg_attack only for the cells of
    blocks with the attack on (`dpmed.seg.spec.attacked`)."""
    return attacked(cell.jobs) if rule == "seg_attack" else list(cell.jobs)


def distinct_cells(grid: Grid, studies: Iterable[str] = STUDY_RULES) -> list[Cell]:
    """The distinct cells of `grid`, in grid order; every job is in exactly one."""
    cells: dict[tuple, Cell] = {}
    for study in studies:
        for job in grid.jobs(study):
            key = shape_key(study, job.wc, job.params)
            cell = cells.setdefault(key, Cell(study, key, job))
            cell.jobs.append(job)
    return list(cells.values())


def _features(cell: Cell) -> set[tuple[str, str]]:
    """What a cell shows the sample: the models, methods (seg: clip rule and DP-Morph kind,
    fets: aggregator and DP mode, xcal: method) and ε of its jobs."""
    out: set[tuple[str, str]] = set()
    for job in cell.jobs:
        wc = job.wc
        if cell.study == "seg":
            names = [f"clip={wc['clip']}", f"morph={_morph_kind(wc['morph'])}"]
        elif cell.study == "fets":
            names = [f"aggregator={cell.key[1]}", f"dpmode={wc['dpmode']}"]
        else:
            names = [f"method={wc['method']}"]
        names += [f"model={wc.get('model', 'resunet3d')}", f"eps={parse_eps(wc['eps']):g}"]
        out |= {(cell.study, name) for name in names}
    return out


def sample_cells(cells: Sequence[Cell]) -> list[Cell]:
    """A small subset of `cells` that still shows every model, every method and every ε of
    each study (`_features`): greedy set cover, taking the cell that adds the most unseen
    features (ties: grid order); returned in grid order."""
    missing = set().union(*(_features(c) for c in cells)) if cells else set()
    chosen: list[Cell] = []
    while missing:
        best = max(cells, key=lambda c: len(_features(c) & missing))
        chosen.append(best)
        missing -= _features(best)
    order = {id(c): i for i, c in enumerate(cells)}
    return sorted(chosen, key=lambda c: order[id(c)])


def cost_features(cell: Cell) -> tuple:
    """What a cell's cost per step depends on, most first (the input and network, private or
    not, then the method's details); `nearest` compares cells on these in order."""
    if cell.study == "seg":
        _, dataset, model, rule, morph, arch = cell.key
        return (dataset, model, arch, rule != "none", morph, rule)
    if cell.study == "fets":
        _, aggregator, dpmode, private, _ = cell.key
        participation = _frozen(cell.job.params["participation"])
        return (collaborator_key(cell), participation, private, aggregator, dpmode)
    _, dataset, model, method, shift, clients, private, net = cell.key
    return (dataset, model, net, private, method, clients, shift)


def nearest(cell: Cell, probed: Sequence[Cell]) -> Cell | None:
    """The probed cell of `cell`'s study most like it: the one whose `cost_features` match
    `cell`'s, feature by feature in order, compared lexicographically (the same dataset
    first, then model, ...; the first in `probed` on ties); None when no cell of the study
    was probed."""
    mine = cost_features(cell)

    def matches(other: Cell) -> tuple[bool, ...]:
        return tuple(a == b for a, b in zip(mine, cost_features(other), strict=True))

    candidates = [c for c in probed if c.study == cell.study]
    return max(candidates, key=matches) if candidates else None
