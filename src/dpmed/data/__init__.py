"""Data layer: synthetic generators writing real raw formats, validating loaders,
preprocessing to one documented processed format per family, and federated partitioners."""
