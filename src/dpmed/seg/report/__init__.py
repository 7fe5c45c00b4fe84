"""Tables and figures of the seg study (paper 002)."""
