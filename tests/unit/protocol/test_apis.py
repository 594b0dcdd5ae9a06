import subprocess
import sys
from pathlib import Path

from proxy.kafka import gen_api_table
from proxy.kafka.versions import (
    APIS,
    api_name,
    is_known,
    request_header_version,
    response_header_version,
    supported_ranges,
)


def test_generated_table_matches_the_installed_kio():
    committed = Path(gen_api_table.TABLE_PATH).read_text()
    assert committed == gen_api_table.render(), (
        "proxy/kafka/api_table.py is stale: run .venv/bin/python -m proxy.protocol.gen_api_table"
    )


def test_importing_the_header_layer_loads_no_kio_schema():
    code = (
        "import sys, proxy.protocol.headers, proxy.protocol.frames; "
        "print(sorted(m for m in sys.modules if m.startswith('kio')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_table_holds_the_apis_the_proxy_rewrites():
    assert APIS[0].name == "Produce"
    assert APIS[3] == ("Metadata", 0, 13, 9)
    assert APIS[10].name == "FindCoordinator"
    assert APIS[18] == ("ApiVersions", 0, 4, 3)
    assert APIS[60].name == "DescribeCluster"
    assert APIS[17].first_flexible is None  # SaslHandshake never became flexible


def test_is_known():
    assert is_known(0, 3)
    assert not is_known(0, 2)  # dropped in Kafka 4
    assert not is_known(0, APIS[0].max_version + 1)
    assert not is_known(999, 0)
    assert not is_known(7, 0)  # ControlledShutdown: inter-broker, not in kio


def test_request_header_versions():
    assert request_header_version(0, 8) == 1
    assert request_header_version(0, 9) == 2
    assert request_header_version(3, 0) == 1
    assert request_header_version(17, 1) == 1  # SaslHandshake: never flexible
    assert request_header_version(18, 2) == 1
    assert request_header_version(18, 3) == 2
    # Like Kafka: a version newer than known still follows the first flexible version.
    assert request_header_version(18, 99) == 2
    assert request_header_version(7, 0) == 0  # ControlledShutdown v0: no client id
    assert request_header_version(7, 1) == 1


def test_response_header_versions():
    assert response_header_version(3, 8) == 0
    assert response_header_version(3, 9) == 1
    assert response_header_version(1, 12) == 1
    for version in range(0, 10):
        assert response_header_version(18, version) == 0  # ApiVersions: always v0


def test_supported_ranges_and_names():
    ranges = supported_ranges()
    assert ranges[18] == (0, 4)
    assert ranges.keys() == APIS.keys()
    assert api_name(1) == "Fetch"
    assert api_name(999) == "api key 999"
