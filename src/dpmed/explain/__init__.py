"""Explanations of the xcal classifiers: Grad-CAM and its ROAD fidelity."""
