"""How the toolchain's go commands are cut: a component's binaries named as go names them build in one command."""
from __future__ import annotations

from drills.toolchain.build import _build_groups
from drills.toolchain.components import base_components, optional_components, rollouts_component


def _by_name(name):
    return {c.name: c for c in [*base_components(), *optional_components().values()]}[name]


def test_binaries_named_as_go_names_them_build_in_one_command():
    kube = _by_name("kubernetes")
    assert _build_groups(kube.binaries) == [("/", list(kube.binaries.values()))]
    ro = rollouts_component("v1.8.2")
    assert _build_groups(ro.binaries) == [("/", list(ro.binaries.values()))]


def test_a_binary_go_would_name_otherwise_builds_alone():
    # go would name the binary of .../server/v3 "v3": it keeps its own -o
    assert _build_groups(_by_name("etcd").binaries) == [("etcd", ["go.etcd.io/etcd/server/v3"])]
    mixed = {"a": "example.com/x/cmd/a", "b": "example.com/x/cmd/b", "tool": "example.com/x/v2"}
    assert _build_groups(mixed) == [("/", ["example.com/x/cmd/a", "example.com/x/cmd/b"]),
                                    ("tool", ["example.com/x/v2"])]


def test_prometheus_builds_without_service_discovery_plugins():
    assert _by_name("prometheus").tags == ("remove_all_sd",)
