"""dpmed installed from a wheel, no checkout in sight: the wheel carries the workflow's files its
commands read, every command runs from an empty folder, and the version names the commit the
wheel was built from (the module guard's `built_from` tells a library of another commit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from dpmed.cli import COMMANDS
from dpmed.install import built_from

# What the commands read from the repository (config templates, the two federations' templates,
# the profiles, the rules job-cost counts groups in).
CARRIED = [
    "config/config.yaml", "config/schema.yaml", "config/smoke.yaml",
    "deploy/openfl/plan/plan.yaml", "deploy/openfl/src/fets.py",
    "deploy/flower/pyproject.toml", "deploy/flower/README.md",
    "profiles/default/config.yaml", "profiles/slurm-template/config.yaml",
    *[str(p.relative_to(REPO)) for p in sorted((REPO / "rules").glob("*.smk"))],
]  # fmt: skip
# What the wheel's study packages carry beside their modules: schema, rule file, captions.
STUDY_FILES = sorted(
    str(p.relative_to(REPO / "src"))
    for pattern in ("*/schema.yaml", "*/rules.smk", "*/captions/*.rst")
    for p in (REPO / "src" / "dpmed").glob(pattern)
)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built into a wheel (offline, with this environment's setuptools-scm) and
    installed with `pip install --target`."""
    root = tmp_path_factory.mktemp("install")
    pip = [sys.executable, "-m", "pip", "--quiet"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "wheel")]
    subprocess.run([*build, str(REPO)], check=True)
    (wheel,) = (root / "wheel").glob("dpmed-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(root / "lib"), wheel], check=True)
    return root / "lib"


def run_installed(
    lib: Path, cwd: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` with the installed dpmed ahead of this checkout's."""
    env = {**os.environ, "PYTHONPATH": str(lib)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_wheel_carries_the_workflow_files_the_commands_read(lib):
    packaged = lib / "dpmed" / "_workflow"
    for name in CARRIED:
        assert (packaged / name).read_bytes() == (REPO / name).read_bytes(), name
    assert len(STUDY_FILES) > 6
    for name in STUDY_FILES:
        assert (lib / name).read_bytes() == (REPO / "src" / name).read_bytes(), name
    assert not list(packaged.rglob(".flwr"))  # Flower's credentials folder stays out


def test_every_command_runs_from_the_install_in_an_empty_folder(lib, tmp_path):
    where = run_installed(lib, tmp_path, "-c", "import dpmed; print(dpmed.__file__)")
    assert where.stdout.strip() == str(lib / "dpmed" / "__init__.py"), where.stderr
    top = run_installed(lib, tmp_path, "-m", "dpmed.cli", "--help")
    assert top.returncode == 0, top.stderr
    for name in COMMANDS:
        help_ = run_installed(lib, tmp_path, "-m", "dpmed.cli", name, "--help")
        assert help_.returncode == 0 and "usage:" in help_.stdout, (name, help_.stderr[-2000:])
    checked = run_installed(lib, tmp_path, "-m", "dpmed.cli", "check-config")
    default = lib / "dpmed" / "_workflow" / "config" / "config.yaml"
    assert checked.returncode == 0 and checked.stdout.startswith(f"{default}: ok"), checked.stderr
    cost = run_installed(lib, tmp_path, "-m", "dpmed.cli", "job-cost")
    assert cost.returncode == 0 and "SLURM submissions" in cost.stdout, cost.stderr[-2000:]
    profile = run_installed(lib, tmp_path, "-m", "dpmed.cli", "slurm-profile",
                            "--dest", str(tmp_path / "profile"), "--account", "a")  # fmt: skip
    assert profile.returncode == 0, profile.stderr
    assert "account: a" in (tmp_path / "profile" / "config.yaml").read_text().replace('"', "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile"]


def test_both_launchers_read_the_installed_templates(lib, tmp_path):
    packaged = lib / "dpmed" / "_workflow"
    code = (
        "from dpmed.fets.openfl_deploy import TEMPLATE\n"
        "from dpmed.xcal.flower.deploy import APP_DIR\n"
        "from dpmed.xcal.flower.runconfig import SMOKE_CONFIG\n"
        "print(TEMPLATE, APP_DIR, SMOKE_CONFIG)\n"
    )
    paths = run_installed(lib, tmp_path, "-c", code)
    assert paths.stdout.split() == [
        str(packaged / "deploy" / "openfl"),
        str(packaged / "deploy" / "flower"),
        str(packaged / "config" / "smoke.yaml"),
    ], paths.stderr
    # the OpenFL launcher reads and checks its default config, then stops at the bad --eps
    refused = run_installed(lib, tmp_path, "-m", "dpmed.cli", "fl-openfl", "--out", "x",
                            "--eps", "nope")  # fmt: skip
    assert refused.returncode == 2
    assert "refused before starting anything: config key '--eps'" in refused.stderr


def test_the_version_names_the_commit_the_wheel_was_built_from(lib, tmp_path):
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    tags = subprocess.run([*git, "tag", "--points-at", "HEAD"], capture_output=True, text=True)
    version = run_installed(lib, tmp_path, "-c", "import dpmed; print(dpmed.__version__)")
    (dist,) = lib.glob("dpmed-*.dist-info")
    assert dist.name == f"dpmed-{version.stdout.strip()}.dist-info"
    public, _, local = version.stdout.strip().partition("+")
    assert local.startswith(f"g{head[:7]}") or f"v{public}" in tags.stdout.split()


@pytest.mark.fl
def test_the_openfl_federation_runs_from_the_install_in_an_empty_folder(lib, tmp_path):
    done = run_installed(lib, tmp_path, "-m", "dpmed.cli", "fl-openfl", "--out", "x", timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    run = "results/fets/dp_simagg/sound/eps1/seed0"  # the launcher's default cell
    assert (tmp_path / "x" / run / "privacy.json").is_file()
    assert (tmp_path / "x" / "openfl" / "processes.json").is_file()


@pytest.mark.fl
def test_the_flower_federation_runs_from_the_install_in_an_empty_folder(lib, tmp_path):
    """The Flower launcher from the wheel: the packaged app on a SuperLink with TLS and
    SuperNode authentication, one job (the smoke XCal-FL cell) to the end."""
    run = "results/xcal/bloodmnist/resnet18/xcal/iid/c3/eps5/seed0"
    done = run_installed(lib, tmp_path, "-m", "dpmed.cli", "fl-flower", "--out", "x", "--run", run,
                         timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "x" / run / "privacy.json").is_file()
    assert "--enable-supernode-auth" in (tmp_path / "x" / "flower" / "processes.json").read_text()


def scm_version(repo: Path) -> str:
    """setuptools-scm's version of the git work tree `repo`, as a build numbers it."""
    from setuptools_scm import get_version

    return get_version(root=str(repo))


def test_built_from_tells_the_commit_setuptools_scm_numbered(tmp_path):
    """The guard's comparison against setuptools-scm's own numbering of a tagged commit, a
    later commit and a modified work tree."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@dpmed.invalid"]

    def commit(text: str) -> str:
        (tmp_path / "f.txt").write_text(text)
        subprocess.run([*git, "add", "f.txt"], check=True)
        subprocess.run([*git, "commit", "-qm", text], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    subprocess.run([*git, "init", "-q"], check=True)
    tagged = commit("a")
    subprocess.run([*git, "tag", "v1.2.0"], check=True)
    release = scm_version(tmp_path)
    later = commit("b")
    dev = scm_version(tmp_path)
    (tmp_path / "f.txt").write_text("modified")
    modified = scm_version(tmp_path)

    assert release == "1.2.0"
    assert built_from(release, tagged, ["v1.2.0"])
    assert not built_from(release, later, [])  # a library of the tag, the workflow one later
    assert built_from(dev, later, [])
    assert not built_from(dev, tagged, ["v1.2.0"])
    assert not built_from(modified, later, [])  # a modified tree is the code of no commit
    assert not built_from(f"1.2.1.dev1+g{'0' * 9}", later, [])  # another commit's hash
