"""kube-apiserver restarted under a live drill (every watch drops), and the drill's watches resumed after etcd
compacted their history meanwhile (410 Gone, relist).  The drill rides these out or stops and restores; either
way the target ends exactly as it was, nothing of the run is left, and a `pass` row stands only on a timeline that
has every VirtualService write the apiserver's audit log has."""
from __future__ import annotations

import pytest
from faultkit import compact_etcd, restart_control_plane
from riding import ends_whole, hold_through, resumed

pytestmark = pytest.mark.single_version


@pytest.mark.parametrize("phase", [pytest.param("before", id="apiserver-restart-during-before"),
                                   pytest.param("after", id="apiserver-restart-during-after")])
def test_kube_apiserver_restarted(stage, cluster, phase):
    s = stage()
    drill = s.live()
    hold_through(s, drill, phase)
    restart_control_plane(cluster, "kube-apiserver")
    ends_whole(s, drill, phase)
    resumed(s, phase)


@pytest.mark.parametrize("phase", [pytest.param("after", id="compaction-410-during-after")])
def test_watch_resumed_after_compaction_relists(stage, cluster, phase):
    """The apiserver goes down, etcd compacts its history meanwhile, and every
    watch the drill resumes from an older resourceVersion is answered 410 Gone: the recorder relists."""
    s = stage()
    drill = s.live()
    hold_through(s, drill, "after")
    pid = cluster._kwok_pids()["kube-apiserver"]
    restart = {}
    # etcd compacts its history while the apiserver is down (nothing can watch meanwhile)
    restart_control_plane(cluster, "kube-apiserver",
                          while_down=lambda: restart.setdefault("compacted_at", compact_etcd(cluster)))
    assert cluster._kwok_pids()["kube-apiserver"] != pid and restart["compacted_at"]
    ends_whole(s, drill, "after")
    gaps = resumed(s, "after")["gaps"]
    assert any("410" in r["obj"]["reason"] for r in gaps), "no watch of the AFTER recording was answered 410"
