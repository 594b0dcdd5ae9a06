"""`--help` on every `tierproxy` command and subcommand, found by walking the help."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from proxy.cli import main

# the subcommands a usage line offers: "{run,dev,fleet,...}"
_CHOICES = re.compile(r"\{([a-z-]+(?:,[a-z-]+)+|[a-z-]+)\}")


def _help(path: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0, path
    return out.getvalue()


def _commands(path: list[str]) -> list[list[str]]:
    text = _help(path)
    assert text.startswith("usage: tierproxy"), path
    usage = text.split("\n\n", 1)[0]
    found = [path]
    for match in _CHOICES.finditer(usage):
        before = usage[: match.start()].split()
        last = before[-1] if before else ""
        if last.lstrip("[(").startswith("-") and not last.endswith(("]", ")")):
            continue  # an option's choices (`--format {a,b}`), not subcommands
        for name in match.group(1).split(","):
            found += _commands([*path, name])
        break
    return found


def test_every_command_has_help():
    commands = {" ".join(path) for path in _commands([])}
    expected = {
        "run", "dev", "fleet status", "topics tier", "topics untier", "topics list",
        "topics status", "migrate", "verify", "export", "clean",
    }  # fmt: skip
    assert expected <= commands, expected - commands


@pytest.mark.parametrize("path", [["topics", "list"], ["topics", "status"], ["fleet", "status"]])
def test_views_offer_json(path):
    assert "--json" in _help(path)
