"""The offload jobs without the `offload` extra (pyspark, pyarrow): `tierproxy migrate`,
`verify` and `export` say what to install, before reading a config or reaching Kafka,
instead of a ModuleNotFoundError from deep inside Spark's start (proxy/devstack/spark.py)."""

from __future__ import annotations

import pytest

from proxy import cli
from proxy.devstack import spark

ARGS = {
    "migrate": ["migrate", "t", "--config", "/nonexistent.yaml", "--peer", "h:1", "--from-cluster"],
    "verify": ["verify", "t", "--config", "/nonexistent.yaml"],
    "export": ["export", "t", "--config", "/nonexistent.yaml", "--to", "/nonexistent"],
}


@pytest.mark.parametrize("command", sorted(ARGS))
def test_a_job_without_the_extra_names_what_to_install(command, monkeypatch, capsys):
    monkeypatch.setattr(spark, "OFFLOAD_PACKAGES", ("pyspark", "tierproxy_no_such_package"))
    assert cli.main(ARGS[command]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tierproxy {command}: the offload jobs need tierproxy_no_such_package")
    assert "tierproxy[offload]" in err and "pyspark" not in err.split("lacks")[0]


def test_with_the_extra_the_check_passes_and_the_job_goes_on(monkeypatch, capsys):
    spark.require_offload_packages()  # this installation has it (setup.sh installs it)
    # the job itself then runs: here it stops at the missing config, its own clear error
    assert cli.main(ARGS["migrate"]) == 2
    assert "offload jobs need" not in capsys.readouterr().err
