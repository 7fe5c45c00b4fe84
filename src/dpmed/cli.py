"""`dpmed COMMAND [ARGS ...]`: the one command line of the commands users run.

Each command is the `main(argv)` of a module, which `python -m <module>` runs as well; it is
imported only when chosen, so `dpmed --help` stays fast. `dpmed COMMAND --help` prints that
command's own options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import dpmed
from dpmed.registry import resolve

# command → ("module:function" taking argv, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "check-config": ("dpmed.config.checks:main", "check config files: job counts and notes"),
    "job-cost": ("dpmed.job_cost:main", "SLURM requests, CPU-/GPU-hours and submissions"),
    "preflight": ("dpmed.preflight.run:main", "probe every cell of a grid before a cluster run"),
    "fl-openfl": ("dpmed.fets.openfl_deploy:main", "DP-SimAgg in a local OpenFL federation"),
    "fl-flower": ("dpmed.xcal.flower.deploy:main", "XCal-FL runs on local Flower federations"),
    "flower-config": ("dpmed.xcal.flower.runconfig:main", "the Flower run config of an xcal cell"),
    "flower-certs": ("dpmed.xcal.flower.certs:main", "TLS certificates and SuperNode keys"),
    "power-plan": ("dpmed.report.power:main", "seeds and compute each paper claim needs"),
    "slurm-profile": ("dpmed.slurm_profile:main", "install the SLURM site profile"),
}


def parser() -> argparse.ArgumentParser:
    """`dpmed`'s parser: it only lists the commands; each command parses its own arguments."""
    top = argparse.ArgumentParser(
        prog="dpmed",
        description="The commands of the dpmed pipeline (each also runs as python -m MODULE).",
        epilog="`dpmed COMMAND --help` prints the command's own options.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=24),
    )
    top.add_argument("--version", action="version", version=f"dpmed {dpmed.__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, line) in COMMANDS.items():
        commands.add_parser(name, help=line, add_help=False)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run `dpmed COMMAND ARGS...` (`argv`, default `sys.argv[1:]`): the command's `main(ARGS)`,
    its exit status returned."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        parser().parse_args(args)  # --help, or the error naming the commands (exit 2)
    return resolve(COMMANDS[args[0]][0])(args[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
