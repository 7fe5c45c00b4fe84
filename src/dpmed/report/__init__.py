"""Shared reporting: figure/table style, the data overview and the privacy summary."""
