"""The fets study's grid (paper 000): axes and wildcard patterns (from the aggregator and DP
mode registries), which cells are jobs, the participation sweep and the config rules a schema
cannot express. The rule file imports it at parse time, so it imports no torch, pandas or
matplotlib (the aggregator registry it reads needs only numpy)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import SweepResult, Wildcards, block_params, param_key
from dpmed.config.wildcards import EPS_PATTERN, NUMBER_PATTERN, format_eps, parse_eps
from dpmed.errors import ConfigError
from dpmed.fets.aggregation import DP_MODES, SIMAGG_DISTANCES, ServerConfig, aggregators

AXES = (("aggregators", "aggregator"), ("dpmodes", "dpmode"), ("eps", "eps"), ("seeds", "seed"))
# The wildcards runs that pair share (`StudySpec.paired`): every compared factor varies.
PAIRED = ("seed",)


# A block's `sweep` (`participation: [ρ, ...]`) runs each of its cells once per ρ, the
# fraction of the K collaborators chosen per round (m = max(1, ⌊ρK⌋)); the aggregator wildcard
# then carries ρ, `dp_fedavg-rho0.4`, so a sweep run never shares a folder with a plain cell.
_RHO = re.compile(rf"^(.+)-rho({NUMBER_PATTERN})$")


def aggregator_name(aggregator: str) -> str:
    """The registered aggregator of an aggregator wildcard (`dp_fedavg-rho0.4` → `dp_fedavg`)."""
    match = _RHO.match(aggregator)
    return match.group(1) if match else aggregator


def server_config(
    params: Mapping[str, Any], wildcards: Mapping[str, str], noise_seed: int | None
) -> ServerConfig:
    """The aggregator settings of a fets job (wildcards aggregator, dpmode, eps; params), its
    server noise seeded by `noise_seed` (None: OS entropy). A participation sweep's `-rho<ρ>`
    suffix of the aggregator wildcard is in the params."""
    eps0 = parse_eps(wildcards["eps"])
    return ServerConfig(
        aggregator=aggregator_name(wildcards["aggregator"]),
        dpmode=wildcards["dpmode"],
        epsilon0=None if math.isinf(eps0) else float(eps0),
        delta0=float(params["delta"]),
        clip_norm=float(params["clip_norm"]),
        simagg_distance=params["simagg_distance"],
        sound_calibration=params["sound_calibration"],
        seed=noise_seed,
    )


def participation_override(aggregator: str) -> dict[str, float]:
    """The participation ρ a swept aggregator wildcard sets ({} for a plain one)."""
    match = _RHO.match(aggregator)
    return {"participation": float(match.group(2))} if match else {}


def sweep_aggregator(name: str, participation: float) -> str:
    """The aggregator wildcard of one sweep cell (inverse of `aggregator_name` and
    `participation_override`).

    >>> sweep_aggregator("dp_fedavg", 0.4), participation_override(sweep_aggregator("fedavg", 1))
    ('dp_fedavg-rho0.4', {'participation': 1.0})
    """
    return f"{name}-rho{format_eps(participation)}"


def wildcard_params(wildcards: Mapping[str, Any]) -> dict[str, float]:
    """Hyperparameters the wildcards of an off-grid target spell (a swept participation)."""
    return participation_override(str(wildcards["aggregator"]))


def sweep(wildcards: Wildcards, params: Mapping[str, Any], cfg: Mapping[str, Any]) -> SweepResult:
    """One job per participation ρ of a block's sweep, the aggregator wildcard spelling it."""
    out = []
    for rho in cfg["participation"]:
        name = sweep_aggregator(dict(wildcards)["aggregator"], rho)
        wc = tuple((k, name if k == "aggregator" else v) for k, v in wildcards)
        out.append((wc, {**params, "participation": float(rho)}))
    return out


def is_swept(wildcards: Mapping[str, str]) -> bool:
    """A run of a participation sweep (its aggregator wildcard carries ρ)."""
    return _RHO.match(wildcards["aggregator"]) is not None


def table_jobs(jobs: Sequence[Any]) -> list[Any]:
    """The plain cells (Table II, the privacy and resources tables, Fig. 4)."""
    return [job for job in jobs if not is_swept(job.wc)]


def sweep_jobs(jobs: Sequence[Any]) -> list[Any]:
    """The runs of the participation sweeps (the ε0 × collaborators-per-round figure)."""
    return [job for job in jobs if is_swept(job.wc)]


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a fets combination is not a job (None when it is one): the aggregator must support
    the DP mode (its registry entry), and a private DP mode needs a finite eps, `none` eps inf."""
    name = aggregator_name(wc["aggregator"])
    modes = aggregators()[name].modes
    if wc["dpmode"] not in modes:
        plural = "s" if len(modes) > 1 else ""
        return f"{name} has only the {'/'.join(modes)} mode{plural}"
    if DP_MODES[wc["dpmode"]].private != (wc["eps"] != "inf"):
        return "private DP modes need a finite eps, dpmode 'none' needs eps inf"
    return None


def _check_block(section: Mapping[str, Any], index: int) -> None:
    params = block_params(section, index)
    depth, patch, base = int(params["depth"]), list(params["patch_size"]), params["base_filters"]
    depth_key = param_key("fets", section, index, "depth")
    if any(side % 2**depth for side in patch):
        raise ConfigError(
            param_key("fets", section, index, "patch_size"),
            f"{patch}: the 3D ResUNet halves every side {depth} times ({depth_key} = {depth}), "
            f"so each side must divide by 2^{depth} = {2**depth}",
        )
    widths = [base * 2**level for level in range(depth + 1)]
    if params["norm"] == "group" and any(w >= 8 and w % 8 for w in widths):
        raise ConfigError(
            param_key("fets", section, index, "base_filters"),
            f"{base} gives level widths {widths} ({depth_key} = {depth}); GroupNorm splits c "
            "channels into min(8, c) groups, so widths of 8 or more must divide by 8 "
            "(use 1, 2, 4 or a multiple of 8)",
        )


def check_config(config: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express, for every grid block's params: patch sides divide
    by 2^depth (the network halves and restores them), and with GroupNorm every level's
    width base_filters·2^level fits its min(8, width) groups."""
    for index in range(len(config["fets"]["grid"])):
        _check_block(config["fets"], index)


PATTERNS = {
    "aggregator": rf"(?:{aggregators().pattern()})(?:-rho{NUMBER_PATTERN})?",  # ρ: a sweep
    "dpmode": DP_MODES.pattern(),
    "eps": EPS_PATTERN,
    "seed": r"[0-9]+",
}
# The config values of the registry-named grid lists and hyperparameters (schema enums at load).
CHOICES: dict[str, tuple[str, ...] | str] = {
    "aggregators": aggregators().names(),
    "dpmodes": DP_MODES.names(),
    "simagg_distance": SIMAGG_DISTANCES.names(),
}
