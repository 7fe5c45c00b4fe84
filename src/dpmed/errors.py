"""Errors raised on bad data or configuration; each names the file or key and what is wrong."""

from __future__ import annotations

from pathlib import Path


class DataFormatError(ValueError):
    """A raw or processed data file does not match its documented format."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(ValueError):
    """A configuration value is invalid; `key` is its dotted path in the config."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"config key '{key}': {problem}")
