"""`dpmed.models.parameter_count` sizes jobs while Snakemake plans them: after the first count of
an architecture it is read from the cache file, without importing torch or MONAI, and always
equals the count of the built network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpmed.models import build_model, parameter_cache

ARCHITECTURES = {
    "unet": {"in_channels": 1, "n_classes": 4, "width": 4, "depth": 2, "norm": "unused"},
    "efficientnet_b0": {"in_channels": 3, "n_classes": 8, "image_size": 28, "width_scale": 0.25},
}
COUNT = f"""
import json, sys
from dpmed.models import parameter_count
counts = {{name: parameter_count(name, **args) for name, args in {ARCHITECTURES!r}.items()}}
print(json.dumps([counts, "torch" in sys.modules or "monai" in sys.modules]))
"""


def counted(cache_home) -> tuple[dict[str, int], bool]:
    """(the counts, whether torch or MONAI was imported) of a fresh interpreter."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    out = subprocess.run([sys.executable, "-c", COUNT], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    counts, imported = json.loads(out)
    return counts, imported


def built(name: str) -> int:
    """Trainable parameters of the network built here (arguments it does not take dropped)."""
    args = {k: v for k, v in ARCHITECTURES[name].items() if k != "norm"}
    return sum(p.numel() for p in build_model(name, **args).parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list[tuple[dict[str, int], bool]]:
    home = tmp_path_factory.mktemp("cache")
    return [counted(home), counted(home)]


def test_the_first_count_builds_the_networks_and_the_second_reads_the_cache(two_runs):
    (first, imported_first), (second, imported_second) = two_runs
    assert imported_first and not imported_second
    assert first == second == {name: built(name) for name in ARCHITECTURES}


def test_a_wrong_or_unreadable_cache_is_never_trusted_blindly(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    parameter_cache.cache_clear()
    path = parameter_cache()
    assert path.is_relative_to(tmp_path / "dpmed")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")  # a torn or foreign file is counted again, then replaced
    counts, imported = counted(tmp_path)
    assert imported and counts == {name: built(name) for name in ARCHITECTURES}
    assert len(json.loads(path.read_text())) == len(ARCHITECTURES)
    parameter_cache.cache_clear()


def test_the_cache_file_is_named_by_the_package_sources(tmp_path, monkeypatch):
    """A network whose source changes is counted again: the file's name follows the sources."""
    import dpmed.models as models

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    parameter_cache.cache_clear()
    names = [parameter_cache().name]
    copy = tmp_path / "models"
    shutil.copytree(Path(models.__file__).parent, copy, ignore=shutil.ignore_patterns("*.pyc"))
    for edit in ("", "# one more line\n"):
        (copy / "unet.py").write_text((copy / "unet.py").read_text() + edit)
        monkeypatch.setattr(models, "__file__", str(copy / "__init__.py"))
        parameter_cache.cache_clear()
        names.append(parameter_cache().name)
    parameter_cache.cache_clear()
    assert names[0] == names[1] != names[2]
