"""A FeTS collaborator: holds one institution's subjects, trains the broadcast model locally and
validates models on its own validation subjects.

Only model tensors leave it (`train` returns the local state dict as numpy arrays and the
data-size weight n_train); validation returns per-subject score sums, never images or labels.
Local training: a fresh Adam optimizer each round (OpenFL's RESET optimizer treatment, so no
hidden state carries across rounds), `local_epochs` × n_train × `patches_per_subject`
label-aware patches in batches of `batch_size`, loss = cross-entropy + soft Dice over the
4 classes. All randomness comes from `seed`, so a round is reproducible on its own (resume).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpmed.data.fets import MODALITIES, load_subject
from dpmed.fets.brats import LABEL_VALUES, subject_scores
from dpmed.fets.patches import ClassIndex, predict_volume, sample_patch

# Validation predicts this many training batches of tiles per forward: inference keeps no
# activations for backward, so it fits where training does, and fewer, larger forwards halve
# the validation time of small models (measured on the demo's 16³ tiles).
TILE_BATCHES = 4


@dataclass(frozen=True)
class LocalTraining:
    """Local training hyperparameters shared by all collaborators."""

    local_epochs: float
    lr: float
    batch_size: int
    patch_size: tuple[int, int, int]
    patches_per_subject: int
    hd95: bool

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> LocalTraining:
        """The hyperparameters of a fets job's `params` (or an OpenFL plan's task runner)."""
        return cls(float(params["local_epochs"]), float(params["lr"]), int(params["batch_size"]),
                   tuple(int(p) for p in params["patch_size"]),
                   int(params["patches_per_subject"]), bool(params["hd95"]))  # fmt: skip


def model_arguments(params: Mapping[str, Any]) -> dict[str, Any]:
    """The 3D ResUNet's build arguments of a fets job's `params` (saved with model.pt)."""
    return {"in_channels": len(MODALITIES), "n_classes": len(LABEL_VALUES),
            "base_filters": int(params["base_filters"]), "depth": int(params["depth"]),
            "norm": params["norm"]}  # fmt: skip


def mean_scores(scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each score over validated subjects, plus the mean Dice over the labels."""
    out = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
    out["dice_mean_labels"] = float(np.mean([out[f"dice_label{v}"] for v in LABEL_VALUES]))
    return out


def state_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's state dict as float32 numpy arrays (what crosses to the aggregator)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy_state(model: nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Load numpy arrays into the model (shapes must match)."""
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 − mean over classes of the soft Dice over the batch (smoothed by 1e-5)."""
    probs = logits.softmax(dim=1)
    onehot = F.one_hot(target, logits.shape[1]).movedim(-1, 1).to(probs.dtype)
    dims = (0, *range(2, logits.ndim))
    inter = (probs * onehot).sum(dims)
    denom = probs.sum(dims) + onehot.sum(dims)
    return 1.0 - ((2.0 * inter + 1e-5) / (denom + 1e-5)).mean()


class Collaborator:
    """One institution. `model` is a workspace module (its weights are overwritten per call)."""

    def __init__(
        self,
        name: str,
        processed_dir: Path,
        train_ids: tuple[str, ...],
        val_ids: tuple[str, ...],
        spec: LocalTraining,
        model: nn.Module,
        device: torch.device,
    ) -> None:
        self.name = name
        self._dir = Path(processed_dir)
        self._train_ids, self._val_ids = train_ids, val_ids
        self._spec, self._model, self._device = spec, model, device
        self._index: dict[str, ClassIndex] = {}

    @property
    def n_train(self) -> int:
        return len(self._train_ids)

    @property
    def n_val(self) -> int:
        return len(self._val_ids)

    def _subject(self, sid: str) -> tuple[np.ndarray, np.ndarray, ClassIndex]:
        image, label = load_subject(self._dir, sid, mmap=True)
        if sid not in self._index:
            self._index[sid] = ClassIndex(label)
        return image, label, self._index[sid]

    def train(self, global_state: Mapping[str, np.ndarray], seed: int) -> tuple[dict, float]:
        """Train the broadcast model locally; returns (local state, data-size weight n_train)."""
        spec, model = self._spec, self._model
        rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        load_numpy_state(model, global_state)
        model.to(self._device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
        n_patches = max(1, int(round(spec.local_epochs * self.n_train * spec.patches_per_subject)))
        order: list[str] = []
        while len(order) < n_patches:
            perm = rng.permutation(self.n_train)
            order += [self._train_ids[i] for i in perm for _ in range(spec.patches_per_subject)]
        order = order[:n_patches]
        for start in range(0, n_patches, spec.batch_size):
            images, labels = [], []
            for sid in order[start : start + spec.batch_size]:
                image, label, index = self._subject(sid)
                img, lab = sample_patch(image, label, index, spec.patch_size, rng)
                images.append(img)
                labels.append(lab)
            x = torch.from_numpy(np.stack(images)).to(self._device)
            y = torch.from_numpy(np.stack(labels)).to(self._device)
            logits = model(x)
            # the mean of the per-voxel losses: CUDA's fused 'mean' is nondeterministic
            ce = F.cross_entropy(logits, y, reduction="none").mean()
            loss = ce + soft_dice_loss(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return state_to_numpy(model), float(self.n_train)

    def validate(self, global_state: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
        """Scores (Dice per label and region, HD95 if configured) of the model on each of this
        collaborator's validation subjects."""
        model = self._model
        load_numpy_state(model, global_state)
        model.to(self._device).eval()
        values = np.asarray(LABEL_VALUES)
        out = []
        for sid in self._val_ids:
            image, label = load_subject(self._dir, sid, mmap=True)
            classes = predict_volume(model, np.asarray(image, dtype=np.float32),
                                     self._spec.patch_size, self._device,
                                     TILE_BATCHES * self._spec.batch_size)  # fmt: skip
            out.append(subject_scores(values[classes], np.asarray(label), self._spec.hd95))
        return out
