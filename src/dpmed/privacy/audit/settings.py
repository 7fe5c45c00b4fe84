"""The audit settings each study's runner offers (`seg`, `xcal`, `fets`), in a module without
torch: the config check reads them when the workflow is parsed, `runs.audit_cell` refuses any
other before it dispatches."""

SETTINGS = {
    "seg": ("gradient", "input", "paper-noise"),
    "xcal": ("gradient", "input"),
    "fets": ("update",),
}


def require_setting(study: str, setting: str) -> None:
    """Raise ValueError unless `study` has an audit offering `setting`."""
    if setting not in SETTINGS.get(study, ()):
        raise ValueError(f"no audit setting {setting!r} for study {study!r} ({SETTINGS})")
