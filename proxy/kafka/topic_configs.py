"""Reading a topic's configs as DescribeConfigs answers them (name -> value string, None
when unset): what the produce rules and retention take from Kafka's topic configs.

Pure. A value missing, unreadable or negative takes the reader's default: each caller
says which (Kafka's default, or "unlimited" where keeping data is the safe side).
"""

from __future__ import annotations


def config_number(value: str | None, default: int) -> int:
    """A non-negative integer config, else `default`."""
    try:
        number = int(value) if value is not None else default
    except ValueError:
        return default
    return number if number >= 0 else default


def cleanup_policies(value: str | None) -> list[str]:
    """The policies of `cleanup.policy` ("delete", "compact"; both "compact,delete")."""
    return [] if value is None else [policy.strip() for policy in value.split(",")]
