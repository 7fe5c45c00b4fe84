"""Validate a config: JSON schema (Snakemake's `validate`, which also fills defaults), then the
rules a schema cannot express. Every failure names the config key and what is wrong.

The workflow runs this when it loads. To check config files without Snakemake (which, for a
YAML syntax error in a --configfile, names neither the file nor the line unless run with
--verbose), from the repository root:

    python -m dpmed.config.checks [FILE ...]    # merged as --configfile; default config/config.yaml

It prints the job counts and notes, or the error (file:line:column for a YAML syntax error, a
key given twice or a number that overflows to inf) and exits 1. Relative `raw:` folders are
read from the current directory.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Hashable, Mapping, MutableMapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dpmed.config.audit import audit_jobs
from dpmed.config.grid import Grid
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.data.splits import split_counts
from dpmed.errors import ConfigError
from dpmed.install import workflow_file
from dpmed.sizing import sized_rules
from dpmed.studies import STUDIES

SPLITS = ("train", "val", "test")
# The only numbers that may be infinite: the items of an ε list (`eps: [inf]`, a non-private
# run; schema `$defs/eps`).
INFINITE_ALLOWED = re.compile(r"\.eps\[\d+\]$")
# What every error about a config lacking required keys adds: such a config is most likely a
# --configfile of a few overrides, which dpmed does not merge onto config/config.yaml (merging
# would silently bring in the paper grids and audit cells the file did not ask for).
PARTIAL_HINT = (
    "hint: a --configfile replaces config/config.yaml (it is not merged into it), so each "
    "config file is complete: start from a copy of config/config.yaml or config/smoke.yaml"
)
# The most characters a line of a schema error shows (a message or value can be a whole block).
SHOWN_CHARS = 300


def load_schema(path: str | Path) -> dict[str, Any]:
    """The config schema at `path` with what the registries name put in, so a registered name
    is one registration: a `data.<name>` entry per registered dataset (its family's
    `$defs/<family>_data`), each registered study's section (its own `$defs`, the schema.yaml
    of its package; optional: an absent section is an empty grid), a `resources.<rule>` scale
    per sized rule, and each study's `StudySpec.choices` (a grid list's items, else a
    `<study>_params` value: an enum of the registered names, or the regex of a str)."""
    schema = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    properties = schema["properties"]
    properties["data"]["properties"] = {
        name: {"$ref": f"#/$defs/{entry.family}_data"} for name, entry in DATASET_REGISTRY.items()
    }
    properties["resources"]["properties"].update(
        {rule: {"$ref": "#/$defs/rule_scale"} for rule in sized_rules()}
    )
    for name, spec in STUDIES.items():
        own = resources.files(f"dpmed.{name}").joinpath("schema.yaml")
        schema["$defs"].update(yaml.safe_load(own.read_text(encoding="utf-8")))
        properties[name] = {"$ref": f"#/$defs/{name}"}
        grid = schema["$defs"][name]["properties"]["grid"]["items"]["properties"]
        params = schema["$defs"][f"{name}_params"]["properties"]
        for key, allowed in spec.choices.items():
            node = grid[key].setdefault("items", {}) if key in grid else params[key]
            if isinstance(allowed, str):
                node.update(type="string", pattern=f"^(?:{allowed})$")
            else:
                node["enum"] = list(allowed)
    return schema


def validate_schema(
    config: MutableMapping[str, Any], schema: str | Path, files: Sequence[str | Path] = ()
) -> None:
    """Snakemake's `validate` (defaults filled in place) against `load_schema(schema)`. Its
    error prints the whole schema (thousands of lines); the WorkflowError raised here holds the
    failure's own message and key path only (`schema_error`)."""
    import json
    import tempfile

    from jsonschema.exceptions import ValidationError
    from snakemake.utils import validate  # heavy import, only where a config is checked
    from snakemake_interface_common.exceptions import WorkflowError

    with tempfile.TemporaryDirectory() as folder:
        assembled = Path(folder) / "schema.json"
        assembled.write_text(json.dumps(load_schema(schema)), encoding="utf-8")
        try:
            validate(config, str(assembled))
        except WorkflowError as err:
            if not isinstance(err.__context__, ValidationError):
                raise
            raise WorkflowError(schema_error(err.__context__, files)) from None


def schema_error(error: Any, files: Sequence[str | Path] = ()) -> str:
    """A jsonschema `ValidationError` in a few lines: its message and the key path with the
    value found there (`On instance['fets']['grid'][0]['eps'][0]: 0`), each cut to
    `SHOWN_CHARS`; a missing required key adds the `PARTIAL_HINT`."""
    import textwrap

    path = "".join(f"[{part!r}]" for part in error.absolute_path)
    lines = [
        f"Error validating {config_source(files)}: {error.message}",
        f"On instance{path}: {error.instance!r}",
    ]
    lines = [textwrap.shorten(line, SHOWN_CHARS, placeholder=" ...") for line in lines]
    return "\n".join([*lines, PARTIAL_HINT] if error.validator == "required" else lines)


def config_source(files: Sequence[str | Path]) -> str:
    """How an error names the config: its files (`a.yaml + b.yaml`), else "the config"."""
    return " + ".join(map(str, files)) or "the config"


class IncompleteConfigError(ValueError):
    """A config lacks required sections or keys (`missing_keys`); the message names them with
    the config's files and adds the `PARTIAL_HINT`."""

    def __init__(self, missing: Sequence[str], files: Sequence[str | Path] = ()) -> None:
        self.missing = list(missing)
        super().__init__(
            f"{config_source(files)}: missing required key{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)}\n{PARTIAL_HINT}"
        )


def missing_keys(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """The required top-level sections `config` lacks (`data`, the studies), then the required
    keys each section it has lacks (`seg.grid`), in schema order."""
    properties = schema["properties"]
    missing = [name for name in schema["required"] if name not in config]
    for name, section in properties.items():
        if isinstance(config.get(name), Mapping):
            if "$ref" in section:  # a study section: `#/$defs/<study>`
                section = schema["$defs"][section["$ref"].rpartition("/")[2]]
            missing += [
                f"{name}.{key}" for key in section.get("required", []) if key not in config[name]
            ]
    return missing


def check_complete(
    config: Mapping[str, Any], schema: str | Path, files: Sequence[str | Path] = ()
) -> None:
    """Raise `IncompleteConfigError` if `config` lacks a required section or a section's
    required key: a --configfile replaces config/config.yaml, so a file of a few overrides
    stops here with one line naming what it lacks instead of a schema error."""
    missing = missing_keys(config, load_schema(schema))
    if missing:
        raise IncompleteConfigError(missing, files)


def check_config(
    config: MutableMapping[str, Any], schema: str | Path, files: Sequence[str | Path] = ()
) -> Grid:
    """Validate `config` in place (schema defaults filled, every mapping's keys sorted) and
    return its expanded `Grid`. `files`, the config files `config` was read from, only name
    it in an error."""
    check_complete(config, schema, files)
    _check_finite(config)  # the schema's bounds do not catch NaN (every comparison is false)
    validate_schema(config, schema, files)
    sort_keys_in_place(config)
    grid = Grid(config)
    for name in STUDIES:
        for dataset in grid.study_datasets(name):
            _check_facts(name, dataset)
    for dataset in grid.datasets():
        _check_dataset(config["data"], dataset)
    for name, spec in STUDIES.items():
        if name in config:
            spec.check(config, grid.jobs(name))
    audit_jobs(config, grid)
    return grid


def sort_keys_in_place(node: Any) -> None:
    """Sort the keys of every mapping below `node`. Snakemake compares a job's params with the
    recorded ones by their repr, so without this a config that only lists keys in another
    order (e.g. written by yaml.safe_dump) would rerun every job."""
    if isinstance(node, MutableMapping):
        items = sorted(node.items())
        node.clear()
        node.update(items)
        for value in node.values():
            sort_keys_in_place(value)
    elif isinstance(node, list):
        for value in node:
            sort_keys_in_place(value)


def _check_finite(node: Any, key: str = "") -> None:
    """Raise ConfigError naming the key and value of the first NaN below `node`, or of an
    infinite number anywhere but in an ε list (`INFINITE_ALLOWED`)."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            _check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _check_finite(value, f"{key}[{index}]")
    elif isinstance(node, float) and not math.isfinite(node):
        eps = INFINITE_ALLOWED.search(key) is not None
        if eps and node == math.inf:
            return
        wanted = "a positive number or inf (non-private)" if eps else "a finite number"
        raise ConfigError(key, f"got {node}; the key takes {wanted}")


def _check_facts(study: str, dataset: str) -> None:
    """A dataset a study's grid uses has every fact the rules, the job sizing and the
    preflight read (`dpmed.data.registry.FACTS`) and is one the study's `dataset` wildcard
    accepts (by default the datasets registered for it, `study_datasets`)."""
    entry = DATASET_REGISTRY[dataset]
    missing = entry.missing()
    if missing:
        raise ConfigError(
            f"data.{dataset}",
            f"dataset '{dataset}' ({study} grid) is registered without {', '.join(missing)} "
            "(dpmed.data.registry): the rules, job sizing or preflight cannot build it",
        )
    accepted = STUDIES[study].patterns.get("dataset")
    if accepted is not None and not re.fullmatch(accepted, dataset):
        raise ConfigError(
            f"{study}.grid",
            f"dataset '{dataset}' is registered for the {entry.study} study; the {study} "
            f"study reads {accepted.replace('|', ', ')}",
        )


def _check_dataset(data: Mapping[str, Any], dataset: str) -> None:
    key = f"data.{dataset}"
    if dataset not in data:
        raise ConfigError(key, "the dataset is used by a study grid but has no data entry")
    cfg = data[dataset]
    entry = DATASET_REGISTRY[dataset]
    if cfg["raw"] == "synthetic":
        missing = [k for k in entry.synthetic_keys if k not in cfg["synthetic"]]
        if missing:
            raise ConfigError(f"{key}.synthetic", f"missing {', '.join(missing)}")
    elif not Path(cfg["raw"]).exists():
        raise ConfigError(f"{key}.raw", f"folder '{cfg['raw']}' does not exist")
    elif not Path(cfg["raw"]).is_dir():
        raise ConfigError(
            f"{key}.raw", f"'{cfg['raw']}' is a file; give the folder that holds the raw files"
        )
    if "split" in cfg:
        _check_split(cfg, key, entry.split_unit)
    synthetic = cfg.get("synthetic", {})
    if synthetic.get("n_annotated", 0) > synthetic.get("n_bscans", math.inf):
        raise ConfigError(f"{key}.synthetic.n_annotated", "exceeds n_bscans")


def _check_split(cfg: Mapping[str, Any], key: str, unit: str | None) -> None:
    """Every split gets items: seg jobs train on train, score val after every epoch and test
    at the end. For synthetic data the counts of `split_counts` are known here; a real
    download is counted when preprocessing reads it (before any training)."""
    split = cfg["split"]
    if not math.isclose(sum(split), 1.0, abs_tol=1e-6):
        raise ConfigError(f"{key}.split", f"fractions {split} must sum to 1")
    empty = [name for name, fraction in zip(SPLITS, split, strict=True) if fraction == 0]
    if empty:
        raise ConfigError(
            f"{key}.split",
            f"fractions {split} leave the {' and '.join(empty)} split empty; seg jobs train on "
            "train, score val after every epoch and test at the end",
        )
    if cfg["raw"] == "synthetic" and unit:
        n = int(cfg["synthetic"][unit])
        try:
            split_counts(n, split)
        except ConfigError:
            raise ConfigError(
                f"{key}.split",
                f"fractions {split} leave the train split empty for {key}.synthetic.{unit} = "
                f"{n}: val and test get max(1, round(fraction·{n})) each, train the rest",
            ) from None


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A key given twice in one YAML mapping (PyYAML would silently keep the last value)."""


class NumberOverflowError(yaml.MarkedYAMLError):
    """A number too large for a float: YAML reads it as ±inf, so `eps: [10, 1.0e+400]` would
    silently hold the non-private ε = inf (`.inf` is the way to write an infinite value)."""


INF_LITERAL = re.compile(r"[-+]?\.(?:inf|Inf|INF)")  # YAML's own spellings of ±inf


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that raises `DuplicateKeyError` on a key given twice in one mapping
    (a `<<:` merge's keys may still be overridden) and `NumberOverflowError` on a number that
    overflows to ±inf."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._refuse_overflow(node, "", set())
        return super().construct_document(node)

    def _refuse_overflow(self, node: yaml.Node, key: str, seen: set[int]) -> None:
        """Raise `NumberOverflowError` naming the dotted `key` (`a.b[0]`) and the literal of
        the first float below `node` that is infinite but not written as `.inf`."""
        if id(node) in seen:  # an alias (maybe recursive) is checked once
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value in node.value:
                name = str(key_node.value)
                self._refuse_overflow(value, f"{key}.{name}" if key else name, seen)
        elif isinstance(node, yaml.SequenceNode):
            for index, value in enumerate(node.value):
                self._refuse_overflow(value, f"{key}[{index}]", seen)
        elif node.tag == "tag:yaml.org,2002:float" and not INF_LITERAL.fullmatch(node.value):
            number = self.construct_yaml_float(node)
            if math.isinf(number):
                raise NumberOverflowError(
                    problem=f"key '{key}' has the number {node.value}, which overflows to "
                    f"{number}; give a finite number, or .inf for an infinite one",
                    problem_mark=node.start_mark,
                )

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # PyYAML's own error follows
            if key in first:
                raise DuplicateKeyError(
                    problem=f"key '{key}' is given twice in one mapping (first at line "
                    f"{first[key].line + 1}); YAML would silently keep the last value",
                    problem_mark=key_node.start_mark,
                )
            first[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML (or JSON) config file as a mapping. A syntax error, a key given twice or a number
    that overflows to ±inf names the file, line and column (and the key): Snakemake's own
    loader names neither, keeps the last value of a repeated key and reads 1.0e+400 as inf."""
    try:
        with open(path, encoding="utf-8") as stream:
            config = yaml.load(stream, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        if isinstance(err, (DuplicateKeyError, NumberOverflowError)):
            raise ValueError(f"{where}: {err.problem}") from None
        context = ""
        if err.context and err.context_mark:
            context = f" ({err.context} at line {err.context_mark.line + 1})"
        raise ValueError(f"{where}: YAML syntax error: {err.problem}{context}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of keys at top level")
    return config


def load_configs(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The config the workflow sees for `--configfile PATHS`: the files merged in order, or
    config/config.yaml when none is given (not yet validated)."""
    from snakemake.utils import update_config

    config: dict[str, Any] = {}
    for path in paths or [workflow_file("config/config.yaml")]:
        update_config(config, load_config_file(path))
    return config


def checked_configs(
    module: str, doc: str | None, argv: Sequence[str] | None
) -> tuple[list[str], dict[str, Any], Grid]:
    """(the files, the config, its `Grid`) of a `python -m <module> [FILE ...]` command line
    (`argv`, default `sys.argv[1:]`; the files merged as `--configfile`, default
    config/config.yaml; `--help` prints `doc`), checked by `check_config`; a bad config exits
    with its error (status 1)."""
    import argparse

    from snakemake_interface_common.exceptions import WorkflowError

    parser = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="config files, merged in order")
    paths = parser.parse_args(argv).files or [str(workflow_file("config/config.yaml"))]
    try:
        config = load_configs(paths)
        grid = check_config(config, workflow_file("config/schema.yaml"), paths)
    except (ValueError, WorkflowError) as err:  # ConfigError is a ValueError
        sys.exit(str(err))
    return paths, config, grid


def main(argv: Sequence[str] | None = None) -> int:
    """Check the config that `--configfile FILE ...` gives (files merged in order, default
    config/config.yaml): print the job counts and notes, or the error and exit 1."""
    paths, config, grid = checked_configs("dpmed.config.checks", __doc__, argv)
    counts = ", ".join(f"{name} {len(grid.jobs(name))} jobs" for name in STUDIES)
    counts += f", audit {len(audit_jobs(config, grid))} jobs"
    print(f"{' + '.join(paths)}: ok ({counts})")
    for note in grid.notes():
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
