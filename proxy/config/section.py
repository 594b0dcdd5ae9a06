"""A section of the YAML config, remembering its dotted key so every error names it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing or wrong; the message names the key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config error at {key}: {reason}")
        self.key = key
        self.reason = reason


_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class Section:
    """One mapping of the YAML document, remembering its dotted key for errors."""

    def __init__(self, raw: Any, prefix: str) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(prefix or "(top level)", f"expected a mapping, got {raw!r}")
        self.raw = raw
        self.prefix = prefix
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str, required: bool = False) -> Any:
        self.used.add(name)
        if name not in self.raw or self.raw[name] is None:
            if required:
                raise ConfigError(self.key(name), "is required")
            return None
        value = self.raw[name]
        if isinstance(value, str):
            match = _ENV_REF.match(value)
            if match:
                if match.group(1) not in os.environ:
                    raise ConfigError(self.key(name), f"environment variable {value} is not set")
                value = os.environ[match.group(1)]
        return value

    def section(self, name: str, required: bool = False) -> Section:
        return Section(self.get(name, required), self.key(name))

    def string(self, name: str, default: str) -> str:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise ConfigError(self.key(name), f"{value!r} is not a non-empty string")
        return value

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.string(name, default)
        if value not in choices:
            raise ConfigError(self.key(name), f"{value!r} is not one of {', '.join(choices)}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(self.key(name), f"{value!r} is not true or false")
        return value

    def optional_boolean(self, name: str) -> bool | None:
        """true, false, or None when the key is absent."""
        return None if self.get(name) is None else self.boolean(name, False)

    def integer(self, name: str, default: int, minimum: int) -> int:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), f"{value!r} is not a whole number")
        if value < minimum:
            raise ConfigError(self.key(name), f"{value} is below the minimum {minimum}")
        return value

    def number(self, name: str, default: float, minimum: float) -> float:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.key(name), f"{value!r} is not a number")
        if value < minimum:
            raise ConfigError(self.key(name), f"{value} is below the minimum {minimum}")
        return float(value)

    def port(self, name: str, default: int) -> int:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise ConfigError(self.key(name), f"{value!r} is not a port (0..65535)")
        return value

    def path(self, name: str) -> Path | None:
        value = self.get(name)
        if value is None:
            return None
        path = Path(str(value))
        if not path.exists():
            raise ConfigError(self.key(name), f"file {path} does not exist")
        return path

    def addresses(self, name: str) -> tuple[tuple[str, int], ...]:
        value = self.get(name, required=True)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items:
            raise ConfigError(self.key(name), f"{value!r} is not a list of host:port")
        parsed = []
        for item in items:
            host, sep, port = str(item).strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ConfigError(self.key(name), f"{item!r} is not host:port")
            parsed.append((host.strip("[]"), int(port)))
        return tuple(parsed)

    def reject_unknown(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            raise ConfigError(self.key(unknown[0]), "is not a known setting")
