"""Privacy: accounting, mechanisms, clipping rules and the `privacy.json` record of every run."""
