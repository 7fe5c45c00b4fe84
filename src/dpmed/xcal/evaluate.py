"""Evaluation of an XCal-FL global model: test F1/accuracy, Grad-CAM and ROAD on a fixed subsample.

Every function takes the network or its Opacus wrapper (whose hooks are then kept quiet).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpmed.explain.gradcam import grad_cam, normalise, quiet, upsample
from dpmed.explain.road import random_attributions, road
from dpmed.metrics.classification import accuracy, macro_f1

BATCH = 256


def predict_proba(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Softmax probabilities (N, K) in eval mode, in batches of `BATCH`."""
    with quiet(module) as net, torch.no_grad():
        return torch.cat([net(x[i : i + BATCH]).softmax(dim=1) for i in range(0, len(x), BATCH)])


def attributions(net: nn.Module, layer: str, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Normalised Grad-CAM maps (N, H, W) for the predicted classes, and those classes (N,)."""
    pred = predict_proba(net, x).argmax(dim=1)
    maps = []
    for i in range(0, len(x), BATCH):
        cam, _ = grad_cam(net, layer, x[i : i + BATCH], pred[i : i + BATCH])
        maps.append(normalise(upsample(cam, x.shape[-1])))
    return torch.cat(maps).cpu().numpy(), pred.cpu().numpy()


def road_of(
    net: nn.Module, x: torch.Tensor, maps: np.ndarray, percentages: list[float], seed: int
) -> dict:
    """ROAD of the attribution `maps` (N, H, W) of the images `x` (`dpmed.explain.road.road`:
    the paper's MoRF confidence drop in %, the MoRF/LeRF curves per removed fraction and the
    combined score)."""
    device = x.device

    def predict(images: np.ndarray) -> np.ndarray:
        batch = torch.as_tensor(images, dtype=torch.float32, device=device)
        return predict_proba(net, batch).cpu().numpy().astype(np.float64)

    return road(predict, x.cpu().numpy(), maps, percentages, seed)


@dataclass(frozen=True)
class Evaluation:
    """What every evaluation of one run shares: the model (or its wrapper), the Grad-CAM layer,
    the test set, the fixed ROAD subsample `road_idx`, its percentages and imputation seed."""

    module: nn.Module
    layer: str
    x: torch.Tensor
    y: torch.Tensor
    n_classes: int
    road_idx: np.ndarray
    percentages: list[float]
    road_seed: int

    def scores(self) -> dict:
        """Macro F1 and accuracy of the argmax predictions on the whole test set."""
        pred = predict_proba(self.module, self.x).argmax(dim=1).cpu().numpy()
        labels = self.y.cpu().numpy()
        return {"f1": macro_f1(labels, pred, self.n_classes), "accuracy": accuracy(labels, pred)}

    def road(self) -> dict:
        """ROAD of the model's Grad-CAM on the fixed subsample."""
        x = self.x[self.road_idx]
        maps, _ = attributions(self.module, self.layer, x)
        return road_of(self.module, x, maps, self.percentages, self.road_seed)

    def road_random(self) -> dict:
        """ROAD of uniform random attributions on the same subsample, imputed with the same
        seed: the score of an explanation that carries no information."""
        x = self.x[self.road_idx]
        maps = random_attributions((len(x), *x.shape[-2:]), self.road_seed)
        return road_of(self.module, x, maps, self.percentages, self.road_seed)
