"""Evaluation metrics: segmentation, structure measures and classification."""
