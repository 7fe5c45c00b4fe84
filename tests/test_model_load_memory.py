"""A `model.pt` declaring a tensor far larger than its network's is refused before the tensor
is allocated (issue 53): `load_model` read every tensor into memory and only then compared it
with the network, so a 200 KiB deflated file holding 200 MB of zeros cost 200 MB (a 1.5 MiB
one, 1.8 GB). Now a compressed record is refused from the zip directory alone and a stored one
is mapped from the file, its shape checked against the declared network before any copy. The
peak memory of the load is measured in a fresh process (Linux's VmHWM, reset before the load:
`ru_maxrss` carries the parent's peak over `fork`)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from dpmed.checkpoint import save_state
from dpmed.models import build_model

UNET = {"in_channels": 1, "n_classes": 2, "width": 4, "depth": 2}
NUMEL = 50_000_000  # float32: 200 MB
TENSOR_KIB = NUMEL * 4 // 1024

# Loads a valid model first (every module imported, allocator warm), then the case: prints
# how far the peak resident memory grew during the case's load and what it said.
CHILD = """
import json, sys
from pathlib import Path
from dpmed.errors import DataFormatError
from dpmed.models import load_model

def kib(field):
    lines = Path("/proc/self/status").read_text().splitlines()
    return int(next(x for x in lines if x.startswith(field)).split()[1])

load_model(sys.argv[1])
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
before = kib("VmRSS:")
try:
    load_model(sys.argv[2])
    said = "loaded"
except DataFormatError as err:
    said = err.problem
print(json.dumps({"grown_kib": kib("VmHWM:") - before, "said": said}))
"""


def _huge(path: Path, compress: bool) -> str:
    """Write a model.pt of the small UNet whose first weight is NUMEL zeros (its records
    deflated when `compress`); returns that weight's name."""
    key = next(iter(build_model("unet", **UNET).state_dict()))
    stored = path.with_suffix(".stored")
    torch.save({"model": "unet", "arguments": UNET, "state_dict": {key: torch.zeros(NUMEL)}},
               stored)  # fmt: skip
    if not compress:
        stored.rename(path)
        return key
    with zipfile.ZipFile(stored) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            with src.open(info) as reader, out.open(info.filename, "w") as writer:
                shutil.copyfileobj(reader, writer, 1 << 24)
    stored.unlink()
    return key


@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/self")
@pytest.mark.parametrize("compress", [True, False], ids=["deflated", "stored"])
def test_a_huge_declared_tensor_is_refused_before_it_is_allocated(tmp_path, compress):
    valid, huge = tmp_path / "valid.pt", tmp_path / "model.pt"
    save_state(valid, {"model": "unet", "arguments": UNET,
                       "state_dict": build_model("unet", **UNET).state_dict()})  # fmt: skip
    key = _huge(huge, compress)
    if compress:
        assert huge.stat().st_size < TENSOR_KIB * 1024 // 100  # a small file …
    result = subprocess.run([sys.executable, "-c", CHILD, str(valid), str(huge)],
                            capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["said"] != "loaded"
    if compress:
        assert "compressed" in out["said"], out
    else:
        assert f"tensor {key!r} has shape ({NUMEL},)" in out["said"], out
    # … whose 200 MB tensor is never allocated
    assert out["grown_kib"] < TENSOR_KIB // 8, out
