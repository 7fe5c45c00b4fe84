"""The shared process layer of the federation launchers: `NewLines`, the reader they relay
progress with (each complete line of a file being written is returned once, a line still being
written waits for its newline), `terminated_by_signals`, which turns SIGTERM/SIGINT into an
exception so a launcher stops what it started, and the launchers' one skeleton: the same
options and defaults on `dpmed fl-openfl` and `dpmed fl-flower`, one launch record
(processes.json), one set of exit statuses."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import pytest

from dpmed import cli
from dpmed import federation_processes as fp
from dpmed.federation_processes import NewLines


def test_each_complete_line_is_returned_once(tmp_path):
    path = tmp_path / "log"
    lines = NewLines(path)
    assert lines.read() == []  # not written yet
    path.write_text("round 1\nround 2 (half")
    assert lines.read() == ["round 1"]
    assert lines.read() == []
    with path.open("a") as handle:
        handle.write(" done)\nround 3\n")
    assert lines.read() == ["round 2 (half done)", "round 3"]
    assert lines.read() == []


def test_bytes_cut_inside_a_character_wait_for_the_whole_line(tmp_path):
    path = tmp_path / "log"
    text = "ε=1.5\n".encode()
    path.write_bytes(text[:1])  # the first byte of ε's two
    lines = NewLines(path)
    assert lines.read() == []
    path.write_bytes(text)
    assert lines.read() == ["ε=1.5"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_started_group_and_restores_the_handler(tmp_path, sig):
    """SIGTERM/SIGINT to the launcher raise `Terminated` naming the signal, the `finally` stops
    the process group it started (the child's own child included), and the old handler is back."""
    before = signal.getsignal(sig)
    shell = fp.start("sleeper", ["sh", "-c", "sleep 60 & sleep 60"], tmp_path / "sleeper.log")
    with pytest.raises(fp.Terminated, match=signal.Signals(sig).name) as caught:
        with fp.terminated_by_signals():
            try:
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises before this ends
                raise AssertionError("no Terminated raised")
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a repeat does not interrupt the stop
                fp.stop([shell], grace=2.0)
    assert caught.value.signum == sig
    assert not fp.group_alive(shell)
    assert signal.getsignal(sig) is before


class Parsed(Exception):
    """Raised with a launcher's parsed arguments, before it starts anything."""


def parsed(command: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    parse = argparse.ArgumentParser.parse_args

    def stop(parser, args=None, namespace=None):
        raise Parsed(parse(parser, args, namespace))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop)
        with pytest.raises(Parsed) as caught:
            cli.main([command, "--out", "unused"])
    return vars(caught.value.args[0])


def test_both_launchers_share_their_options_and_defaults(monkeypatch):
    """The options both launchers have mean the same and default the same: secret noise,
    config files as a list, the same timeouts."""
    openfl, flower = parsed("fl-openfl", monkeypatch), parsed("fl-flower", monkeypatch)
    shared = ["out", "config", "processed", "seeded", "timeout", "round_timeout"]
    assert {k: openfl[k] for k in shared} == {k: flower[k] for k in shared}
    assert (openfl["seeded"], openfl["processed"], len(openfl["config"])) == (False, None, 1)
    assert 0 < openfl["round_timeout"] < openfl["timeout"]


def test_a_launch_clears_the_last_one_and_records_what_stopped_it(tmp_path):
    """A launch removes what the previous one left (not its lock), writes
    processes.json at once, and on an error records it, stops every process group it
    started and writes the record with the processes' exit codes."""
    work = tmp_path / "launch"
    (work / "old").mkdir(parents=True)
    (work / "old" / "f").write_text("")
    (work / "processes.json").write_text("previous")
    with pytest.raises(fp.FederationProcessError, match="boom"):
        with fp.launching(work, ["job"]) as record:
            assert sorted(p.name for p in work.iterdir()) == [".lock", "processes.json"]
            assert json.loads((work / "processes.json").read_text())["status"] == ["starting"]
            shell = record.started(fp.start("sleeper", ["sh", "-c", "sleep 60 & sleep 60"],
                                            work / "sleeper.log"))  # fmt: skip
            running = json.loads((work / "processes.json").read_text())["processes"]
            assert [(p["name"], p["returncode"]) for p in running] == [("sleeper", None)]
            raise fp.FederationProcessError("boom")
    assert not fp.group_alive(shell)
    final = json.loads((work / "processes.json").read_text())
    assert (final["error"], final["status"], final["jobs"]) == ("boom", ["stopped"], ["job"])
    assert final["processes"][0]["returncode"] == -signal.SIGTERM


@pytest.mark.parametrize(
    ("error", "status"),
    [(fp.Terminated(signal.SIGTERM), 128 + signal.SIGTERM),
     (fp.Terminated(signal.SIGINT), 128 + signal.SIGINT),
     (fp.FederationProcessError("a collaborator died"), 1)],
)  # fmt: skip
def test_a_failed_launch_exits_with_the_shells_status(error, status, tmp_path, capsys):
    """A signal gives 128 + its number, as a shell reports a command it killed; any other
    failure 1; each says why and where the record is."""

    def launch():
        raise error

    assert fp.finish(tmp_path, launch) == status
    assert capsys.readouterr().err == f"federation failed: {error}; record in {tmp_path}\n"


def test_a_launch_that_ends_well_exits_zero_naming_its_processes(tmp_path, capsys):
    table = [{"name": "aggregator", "pid": 7, "ports": {"grpc": 9}, "command": "fx run"}]
    record = {"processes": table, "status": ["complete"], "seconds": 1.0}
    assert fp.finish(tmp_path, lambda: record) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["aggregator", "pid", "7", "ports", "{'grpc':", "9}", "fx", "run"]
    assert lines[1] == f"['complete'] in 1.0 s; record in {tmp_path}"
