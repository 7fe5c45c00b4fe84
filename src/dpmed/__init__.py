"""dpmed: reproducible differentially private deep learning on medical images."""

__version__ = "0.1.0"
