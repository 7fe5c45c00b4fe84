"""What OpenFL 1.9 hard-codes that a local federation must change; `patch_openfl` applies it
(the workspace template's `deploy/openfl/src/fets.py` calls it, so the aggregator and every
collaborator do before they serve or decompress a tensor).

- NumPy >= 2.4: OpenFL's lossless pipeline decompresses every tensor with
  `np.reshape(..., newshape=...)`, a keyword NumPy 2.4 removed, so a process fails on the
  first tensor it receives; the same reshape without that keyword replaces it (same bytes, same
  float32 array). On older NumPy nothing changes.
- Binding: `AggregatorGRPCServer` listens on `[::]:<agg_port>`, every interface; the plan's
  `network.settings.bind_addr` (dpmed's key, e.g. 127.0.0.1) names the interface instead
  (absent: OpenFL's `[::]`).
- A shared port: gRPC sets SO_REUSEPORT on its sockets, so a second gRPC server on the same
  port binds too and takes part of the collaborators' calls; with `grpc.so_reuseport` 0 the
  aggregator's bind fails at once instead.
- An aggregator without TLS prints an `INSECURE` warning to stderr when it starts.
"""

from __future__ import annotations

import sys

import numpy as np
from openfl.pipelines.pipeline import Float32NumpyArrayToBytes
from openfl.transport.grpc import common
from openfl.transport.grpc.aggregator_server import AggregatorGRPCServer

NO_REUSEPORT = ("grpc.so_reuseport", 0)
_server_init = AggregatorGRPCServer.__init__


def _needs_patch() -> bool:
    try:
        np.reshape(np.zeros(1), newshape=(1,))
    except TypeError:
        return True
    return False


def _backward(self: Float32NumpyArrayToBytes, data: bytes, metadata: dict, **kwargs) -> np.ndarray:
    """OpenFL's `Float32NumpyArrayToBytes.backward` without the removed keyword."""
    flat = np.frombuffer(data, dtype=np.float32)
    return np.reshape(flat, tuple(metadata["int_list"]), order="C")


def _bound_init(self: AggregatorGRPCServer, *args, bind_addr: str = "[::]", **kwargs) -> None:
    """OpenFL's server init, listening on `bind_addr` (the plan's network setting) only."""
    _server_init(self, *args, **kwargs)
    self.uri = f"{bind_addr}:{self.uri.rpartition(':')[2]}"
    if not self.use_tls:
        print(f"INSECURE: the OpenFL aggregator serves {self.uri} without TLS or client "
              "authentication (network.settings.use_tls false): any process that reaches the "
              "port can join or read the federation", file=sys.stderr, flush=True)  # fmt: skip


def patch_openfl() -> None:
    """Apply the module's changes to OpenFL (idempotent)."""
    if _needs_patch():
        Float32NumpyArrayToBytes.backward = _backward
    AggregatorGRPCServer.__init__ = _bound_init
    if NO_REUSEPORT not in common.DEFAULT_CHANNEL_OPTIONS:
        common.DEFAULT_CHANNEL_OPTIONS = [*common.DEFAULT_CHANNEL_OPTIONS, NO_REUSEPORT]
