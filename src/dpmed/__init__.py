"""dpmed: reproducible differentially private deep learning on medical images."""


def _version() -> str:
    """The version dpmed was installed at (setuptools-scm: from the git tag and commit): the
    wheel metadata installed beside this package (`pip install --target`), else the
    environment's (an editable install; never a checkout's src/dpmed.egg-info, which a later
    build rewrites), else 0+unknown (src/ on the path, never installed)."""
    from importlib import metadata
    from pathlib import Path

    for found in sorted(Path(__file__).resolve().parents[1].glob("dpmed-*.dist-info")):
        return metadata.PathDistribution(found).version
    try:
        return metadata.version("dpmed")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
