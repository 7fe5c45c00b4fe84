"""`NewLines`, the reader the federation launchers relay progress with: each complete line of a
file being written is returned once, a line still being written waits for its newline."""

from __future__ import annotations

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
