"""The wheel carries the repository's folders that dpmed's commands read (`dpmed.install`), copied
at build time into dpmed/_workflow; an editable install reads them from the checkout."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

WORKFLOW_DIRS = ("config", "deploy/openfl", "deploy/flower", "profiles", "rules")


class BuildPyWithWorkflow(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        root = Path(__file__).resolve().parent
        packaged = Path(self.build_lib) / "dpmed" / "_workflow"
        shutil.rmtree(packaged, ignore_errors=True)  # nothing of an earlier build's copy
        for name in WORKFLOW_DIRS:
            shutil.copytree(
                root / name,
                packaged / name,
                ignore=shutil.ignore_patterns(".flwr", "__pycache__", "*.pyc"),
            )


setup(cmdclass={"build_py": BuildPyWithWorkflow})
