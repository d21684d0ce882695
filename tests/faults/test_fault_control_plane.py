"""The stand-in stage's control plane failing under a live drill: the rollouts controller killed and started again,
and etcd paused for longer than the drill's request timeout (the apiserver's faults: test_fault_apiserver).

A drill rides these out or stops and restores; either way the target ends exactly as it was, nothing of the run is
left, the cluster is whole again, and a `pass` row stands only on a timeline that has every VirtualService write
the apiserver's audit log has (the recorder's completeness, checked independently here)."""
from __future__ import annotations

import pytest
from faultkit import Paused, kill_registered, restart_registered
from kubernetes import client
from riding import ends_whole, hold_through

from drills.core.wait import until

pytestmark = pytest.mark.single_version

REQUEST_TIMEOUT_S = 2       # the drill's DRILLS_REQUEST_TIMEOUT in these cases (the default is 15 s)


@pytest.mark.parametrize("phase", [pytest.param("before", id="controller-restart-during-before"),
                                   pytest.param("after", id="controller-restart-during-after")])
def test_rollouts_controller_killed_and_restarted(stage, cluster, phase):
    s = stage()
    drill = s.live()
    hold_through(s, drill, phase)
    image = kill_registered(cluster, "rollouts-controller")      # returns once the process is gone
    s.release()         # the revived pods may turn Ready while no controller reconciles
    restart_registered(cluster, image)
    ends_whole(s, drill, phase)


@pytest.mark.parametrize("phase", [pytest.param("before", id="etcd-pause-during-before"),
                                   pytest.param("exit", id="etcd-pause-during-exit")])
def test_etcd_paused_longer_than_a_request_timeout(stage, cluster, kube, phase):
    s = stage()
    if phase == "exit":
        s.hold(s.d.hash_v1, period=3)
    drill = s.live(env={"DRILLS_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)})
    hold_through(s, drill, phase)
    co = client.CustomObjectsApi(kube)
    timeouts = []

    def a_read_timed_out() -> bool:
        try:
            co.get_namespaced_custom_object("argoproj.io", "v1alpha1", s.ns, "rollouts", s.name,
                                            _request_timeout=(5, REQUEST_TIMEOUT_S))
        except Exception as e:      # the read the drill would send, with the drill's timeout, got no answer
            timeouts.append(type(e).__name__)
        return len(timeouts) >= 2
    with Paused(cluster, "etcd"):
        until("two reads with the drill's request timeout to go unanswered", a_read_timed_out,
              timeout=60, interval=0)
    ends_whole(s, drill, phase)
