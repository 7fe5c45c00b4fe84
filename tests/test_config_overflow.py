"""A number literal too large for a float stops the config at load (issue 53), naming the file,
line, key and literal: YAML reads `1.0e+400` as inf, so `eps: [10, 1.0e+400]` silently became
the non-private cell (one seg job fewer, none of them at the ε asked for). `.inf` stays the way
to ask for a non-private run."""

from __future__ import annotations

import math
import re

import pytest
from conftest import SMOKE_CONFIG

from dpmed.config.checks import load_config_file, load_configs

SMOKE_TEXT = SMOKE_CONFIG.read_text()
FLAT_EPS = "      eps: [10, 200]\n"  # the smoke config's seg block of flat DP-SGD at two more ε

# (case, the YAML text, the key and the literal the error names)
OVERFLOWS = [
    ("eps-list", "seg:\n  grid:\n    - eps: [10, 1.0e+400]\n", "seg.grid[0].eps[1]", "1.0e+400"),
    ("negative", "xcal:\n  defaults:\n    lr: -1.5e+999\n", "xcal.defaults.lr", "-1.5e+999"),
    ("explicit-tag", "audit:\n  confidence: !!float 1e400\n", "audit.confidence", "1e400"),
    ("flow-mapping", "data: {duke: {scale: 9.9e+308}}\n", "data.duke.scale", "9.9e+308"),
    ("aliased", "a: &big [1.0e+500]\nb: *big\n", "a[0]", "1.0e+500"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "literal"), [c[1:] for c in OVERFLOWS],
                         ids=[c[0] for c in OVERFLOWS])  # fmt: skip
def test_a_number_that_overflows_stops_at_load_naming_file_key_and_value(
    tmp_path, text, key, literal
):
    path = tmp_path / "override.yaml"
    path.write_text(text)
    line = text[: text.index(literal)].count("\n") + 1
    pattern = rf"^{re.escape(str(path))}:{line}:\d+: key '{re.escape(key)}' has the number "
    with pytest.raises(ValueError, match=pattern + re.escape(literal)):
        load_config_file(path)


def test_the_smoke_config_with_an_overflowing_eps_stops_at_load(tmp_path):
    assert SMOKE_TEXT.count(FLAT_EPS) == 1
    path = tmp_path / "smoke.yaml"
    path.write_text(SMOKE_TEXT.replace(FLAT_EPS, "      eps: [10, 1.0e+400]\n"))
    line = SMOKE_TEXT[: SMOKE_TEXT.index(FLAT_EPS)].count("\n") + 1
    with pytest.raises(ValueError, match=rf":{line}:\d+: key 'seg\.grid\[\d+\]\.eps\[1\]'"):
        load_configs([path])


def test_infinities_written_as_such_and_large_finite_numbers_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("eps: [50, .inf, -.Inf, +.INF, inf, 1.7e+308]\n")
    assert load_config_file(path)["eps"] == [50, math.inf, -math.inf, math.inf, "inf", 1.7e308]
