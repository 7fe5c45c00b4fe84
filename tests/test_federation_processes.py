"""The shared process layer of the federation launchers: `NewLines`, the reader they relay
progress with (each complete line of a file being written is returned once, a line still being
written waits for its newline), and `terminated_by_signals`, which turns SIGTERM/SIGINT into an
exception so a launcher stops what it started."""

from __future__ import annotations

import os
import signal
import time

import pytest

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
