"""The one error a user sees for bad input: a single line naming the file and the field."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad input in a config, target or space file, or on the command line."""

    def __init__(self, file: str, field: str, message: str) -> None:
        self.file, self.field, self.message = str(file), field, message
        where = f"{self.file}: {field}" if field else self.file
        super().__init__(f"{where}: {message}")
