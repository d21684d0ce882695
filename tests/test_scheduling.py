"""How `make test` hands its tests to the workers (tests/conftest.py): whole files (--dist loadfile), but every test
on a later controller version to one worker, so that no worker's cluster is replaced twice for each such file."""
from __future__ import annotations

from scheduling import VersionGroupedFileScheduling, later_version

LATER = ("v1.10.2",)


def scope(nodeid: str) -> str:
    sched = object.__new__(VersionGroupedFileScheduling)     # the split alone: no xdist session behind it
    sched.later = LATER
    return sched._split_scope(nodeid)


def test_a_later_version_is_read_from_the_parameters_alone():
    assert later_version("tests/test_probe.py::test_x[v1.10.2]", LATER) == "v1.10.2"
    assert later_version("tests/test_probe.py::test_x[v1.10.2-sigint-during-after]", LATER) == "v1.10.2"
    assert later_version("tests/test_probe.py::test_x[case-v1.10.2]", LATER) == "v1.10.2"
    assert later_version("tests/test_probe.py::test_x[v1.8.2]", LATER) is None
    assert later_version("tests/test_probe.py::test_x[v1.10.20]", LATER) is None
    assert later_version("tests/test_v1.10.2.py::test_x", LATER) is None
    assert later_version("tests/test_probe.py::test_x[v1.10.2]", ()) is None
    # a version with a hyphen is whole parts of the id; of two that fit, the longer is the test's
    assert later_version("tests/test_probe.py::test_x[v1.11.0-rc1-case]", ("v1.11.0-rc1",)) == "v1.11.0-rc1"
    assert later_version("tests/test_probe.py::test_x[v1.11.0-rc1]", ("v1.11.0",), ("v1.11.0-rc1",)) is None
    assert later_version("tests/test_probe.py::test_x[v1.11.0-case]", ("v1.11.0",), ("v1.11.0-rc1",)) == "v1.11.0"
    assert later_version("tests/test_probe.py::test_x[v1.10.2rc]", LATER) is None


def test_tests_of_a_later_version_share_one_scope_across_files_the_others_keep_their_file():
    assert scope("tests/test_probe.py::test_x[v1.10.2]") == scope("tests/test_actions.py::T::test_y[v1.10.2-a]") \
        == "controller v1.10.2"
    assert scope("tests/test_probe.py::test_x[v1.8.2]") == scope("tests/test_probe.py::test_z") == \
        "tests/test_probe.py"
    assert scope("tests/faults/test_fault_api.py::test_x[v1.8.2-kill]") == "tests/faults/test_fault_api.py"
