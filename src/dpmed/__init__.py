"""dpmed: reproducible differentially private deep learning on medical images."""


def _version() -> str:
    """The version dpmed was installed at (setuptools-scm: from the git tag and commit): the
    metadata installed beside this package (a wheel, `pip install --target`), else the
    environment's (an editable install), else 0+unknown (src/ on the path, never installed)."""
    from importlib import metadata
    from pathlib import Path

    beside = str(Path(__file__).resolve().parents[1])
    for dist in metadata.distributions(name="dpmed", path=[beside]):
        return dist.version
    try:
        return metadata.version("dpmed")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
