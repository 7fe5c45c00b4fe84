"""The OpenFL workspace as OpenFL's users handle it, without a federation (issue 55): the
launcher's filled workspace passes `fx workspace export` and `fx workspace import` (OpenFL 1.9's
export needs requirements.txt); the template's requirements pin what dpmed's own metadata pins;
rounds.csv rows from the aggregator's records and scores; privacy.json's `not_covered` names
the files present."""

from __future__ import annotations

import math
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dpmed.fets import openfl_deploy as od
from dpmed.fets.privacy import PAPER_NOT_COVERED, ROUND_COLUMNS
from dpmed.fets.server import ServerConfig

pytest.importorskip("openfl")


def pins(lines: list[str]) -> dict[str, str]:
    """{name: specifier} of the `==` pins among requirement lines."""
    found = {}
    for line in lines:
        req = Requirement(line)
        if str(req.specifier).startswith("=="):
            found[req.name] = str(req.specifier)
    return found


def test_template_requirements_pin_dpmeds_own_pins():
    text = (od.TEMPLATE / "requirements.txt").read_text()
    lines = [ln.split(" #")[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    theirs = pins([r.split(";")[0] for r in metadata.requires("dpmed")])
    mine = pins(lines)
    assert mine["torch"] == theirs["torch"] and mine["openfl"] == theirs["openfl"]
    filled = od.fill_requirements(text, "1.2.3")
    assert Requirement("dpmed[fl]==1.2.3") in [Requirement(ln) for ln in filled.splitlines()
                                               if ln and not ln.startswith("#")]  # fmt: skip
    with pytest.raises(ValueError, match="one `dpmed\\[fl\\]==` line"):
        od.fill_requirements("torch==2.13.0\n", "1.2.3")


def test_fx_workspace_export_and_import(tmp_path):
    """The launcher's workspace, initialized (save/init.pbuf), exports with OpenFL's own
    `fx workspace export`, and `fx workspace import` unpacks it into a fresh folder whole."""
    plan = od.yaml.safe_load((od.TEMPLATE / "plan" / "plan.yaml").read_text())
    workspace = tmp_path / "ws" / "workspace"
    od.make_workspace(workspace, od.TEMPLATE, plan, {"1": tmp_path / "site1"})
    (workspace / "save" / "init.pbuf").write_bytes(b"initial model")
    export = subprocess.run(od.fx_command("workspace", "export"), cwd=workspace,
                            capture_output=True, text=True)  # fmt: skip
    assert export.returncode == 0, export.stdout[-2000:] + export.stderr[-2000:]
    fresh = tmp_path / "site"
    fresh.mkdir()
    archive = workspace / "workspace.zip"
    imported = subprocess.run(od.fx_command("workspace", "import", "--archive", str(archive)),
                              cwd=fresh, capture_output=True, text=True)  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert_import_of(fresh / "workspace", workspace)


def assert_import_of(imported: Path, workspace: Path) -> None:
    """`imported` holds the workspace's plan, code, initial model and requirements.txt, each
    file as in `workspace`."""
    files = {p.relative_to(imported).as_posix() for p in imported.rglob("*") if p.is_file()}
    code = {f"{folder}/{name}" for folder, name in (("src", "fets.py"), ("src", "__init__.py"))}
    assert {"plan/plan.yaml", "plan/cols.yaml", "plan/data.yaml", "save/init.pbuf",
            "requirements.txt", ".workspace", *code} <= files  # fmt: skip
    for name in files:
        assert (imported / name).read_bytes() == (workspace / name).read_bytes(), name


def test_rounds_frame_joins_records_and_scores():
    """Row r: round r's trainers and privacy columns (record r − 1) and the scores of the model
    after r rounds; what is missing stays empty (round 0 has no record, round 3 no score)."""
    records = [{"chosen": ["2", "1"], **{c: float(i) for i, c in enumerate(ROUND_COLUMNS)}},
               {"chosen": ["3"], **{c: 10.0 + i for i, c in enumerate(ROUND_COLUMNS)}},
               {"chosen": ["1"], **{c: 20.0 + i for i, c in enumerate(ROUND_COLUMNS)}}]  # fmt: skip
    scores = {0: {"dice_WT": 0.1, "dice_mean_labels": 0.2},
              2: {"dice_WT": 0.5, "dice_mean_labels": 0.6},
              1: {"dice_WT": 0.3, "dice_mean_labels": 0.4}}  # fmt: skip
    frame = od.rounds_frame(records, scores)
    assert frame["round"].tolist() == [0, 1, 2, 3]
    assert frame["chosen"].tolist() == ["", "2;1", "3", "1"]
    assert frame["dice_WT"].tolist()[:3] == [0.1, 0.3, 0.5] and math.isnan(frame["dice_WT"][3])
    assert all(math.isnan(frame[c][0]) for c in ROUND_COLUMNS)
    assert frame["eps_basic_cum"].tolist()[1:] == [records[r]["eps_basic_cum"] for r in range(3)]


def test_not_covered_names_the_files_present(tmp_path):
    """Exactly the run folder's files but model.pt, plus privacy.json (written with it), and
    the launch folder's as openfl/<name>; paper mode adds its empirical sensitivity."""
    run, work = tmp_path / "results" / "run", tmp_path / "openfl"
    for folder, names in ((run, ("rounds.csv", "model.pt")), (work, ("processes.json", ".lock"))):
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_text("")
    for name in ("workspace", "logs", "sites"):
        (work / name).mkdir()
    sound = ServerConfig("dp_simagg", "sound", 1.0, 1e-5, 1.0, "l2", "analytic", None)
    named = [item.split(":", 1)[0] for item in od.not_covered(tmp_path, run, sound)]
    assert sorted(named) == sorted(["openfl/.lock", "openfl/logs", "privacy.json",
                                    "openfl/processes.json", "rounds.csv", "openfl/sites",
                                    "openfl/workspace"])  # fmt: skip
    paper = ServerConfig("dp_simagg", "paper", 1.0, 1e-5, 1.0, "l2", "analytic", None)
    assert od.not_covered(tmp_path, run, paper)[len(named) :] == list(PAPER_NOT_COVERED)
