"""How the shared part's tests are grouped and ordered over xdist workers
(tests/support/schedule.py): pure decisions, on node ids and made-up times."""

from tests.support.schedule import group_of, longest_first, misplaced, module_times

FAULTS = "tests/integration/faults/test_fault_injection.py::test_fleet_under_faults"
WAL_A = "tests/integration/wal/test_s3wal.py::test_a"
WAL_B = "tests/integration/wal/test_s3wal.py::test_b[x::y]"
EXPORT = "tests/integration/offload/test_export.py::test_export"
VERIFY = "tests/integration/offload/test_verify.py::TestVerify::test_verify"


def test_a_module_is_its_own_group_unless_it_shares_a_costly_fixture_or_package():
    assert group_of(WAL_A) == group_of(WAL_B) == "tests/integration/wal/test_s3wal.py"
    assert group_of(EXPORT) == group_of(VERIFY) == "spark"
    assert group_of("tests/integration/proxy/test_sasl.py::test_plain") == "secured-kafka"
    assert group_of("tests/conformance/test_conformance_generated.py::test_x[before]") == (
        "conformance"
    )
    assert group_of("tests/conformance_extra/test_x.py::test_y") != "conformance"


def test_a_module_using_a_shared_fixture_outside_its_group_is_named():
    tests = [
        (EXPORT, ["spark", "kafka_cluster"]),
        (WAL_A, ["kafka_cluster", "tmp_path"]),
        ("tests/integration/offload/test_new.py::test_a", ["spark"]),
        ("tests/integration/offload/test_new.py::test_b", ["spark"]),
        ("tests/integration/proxy/test_mtls.py::test_a", ["secured_cluster"]),
    ]
    assert misplaced(tests) == [
        "tests/integration/offload/test_new.py: uses spark, so add it to GROUPS as 'spark'",
        "tests/integration/proxy/test_mtls.py: uses secured_cluster, so add it to GROUPS "
        "as 'secured-kafka'",
    ]
    assert misplaced(tests[:2]) == []


def test_groups_run_longest_first_and_keep_their_tests_in_order():
    nodeids = [WAL_A, EXPORT, FAULTS, WAL_B, VERIFY]
    times = {
        "tests.integration.wal.test_s3wal": 10.0,
        "tests.integration.offload.test_export": 30.0,
        "tests.integration.offload.test_verify.TestVerify": 30.0,  # a class's tests
        "tests.integration.faults.test_fault_injection": 50.0,
    }
    # spark: 60 s over two modules, faults 50 s, wal 10 s
    assert longest_first(nodeids, times) == [1, 4, 2, 0, 3]


def test_a_group_not_timed_goes_first_and_no_times_keeps_collection_order():
    times = {"tests.integration.wal.test_s3wal": 10.0}
    assert longest_first([WAL_A, FAULTS], times) == [1, 0]
    assert longest_first([WAL_A, FAULTS], {}) == [0, 1]


def test_times_are_read_per_classname_from_junit_xml(tmp_path):
    xml = tmp_path / "shared.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.integration.wal.test_s3wal" name="a" time="1.5"/>'
        '<testcase classname="tests.integration.wal.test_s3wal" name="b" time="2.0"/>'
        '<testcase classname="tests.conformance.test_x" name="c" time="4"/>'
        "</testsuite></testsuites>"
    )
    assert module_times(xml) == {
        "tests.integration.wal.test_s3wal": 3.5,
        "tests.conformance.test_x": 4.0,
    }
    assert module_times(tmp_path / "missing.xml") == {}
    (tmp_path / "cut.xml").write_text("<testsuites><testsuite")
    assert module_times(tmp_path / "cut.xml") == {}
