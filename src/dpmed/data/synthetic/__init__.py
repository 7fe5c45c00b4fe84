"""Synthetic generators: each writes the public raw format of its real dataset with
learnable structure, so the same loader reads synthetic and real data."""
