"""The audit settings each study's runner offers, in a module without torch: the config check
reads them when the workflow is parsed, the runners (`seg`, `xcal`, `fets`) when they run."""

SEG_SETTINGS = ("gradient", "input", "paper-noise")
XCAL_SETTINGS = ("gradient", "input")
FETS_SETTINGS = ("update",)
SETTINGS = {"seg": SEG_SETTINGS, "xcal": XCAL_SETTINGS, "fets": FETS_SETTINGS}
