"""The mesh emulator dying mid-drill: lane A on the embedded cluster (its load goes through the emulated mesh in
front of the drill's Rollout) loses the emulator while BEFORE's rollback is under way.  Requests refused from then
on are the harness's failure, not the Rollout's: BEFORE's load rows from the emulator's death on are
`inconclusive` naming it, never a pass or a fail; the lane stops what it started and nothing is left."""
from __future__ import annotations

import threading

import pytest
from checks import World, cluster_whole
from faultkit import RolloutWatch, app_image, kill_registered

from drills.lanes import LaneContext
from drills.lanes import get as lane_class
from drills.record.ledger import Ledger
from drills.core.wait import until

pytestmark = pytest.mark.single_version


@pytest.mark.parametrize("phase", [pytest.param("before", id="mesh-emulator-killed-during-before")])
def test_mesh_emulator_killed_mid_drill(kube, cluster, namespace, tmp_path, controller_version, phase):
    world = World(kube, cluster)
    ledger = Ledger(tmp_path / "run", "faults-mesh", target="embedded", controller_version=controller_version)
    ctx = LaneContext(api=kube, namespace=namespace, evidence_dir=tmp_path / "run" / controller_version,
                      ledger=ledger, version=controller_version, cluster=cluster,
                      audit_log=cluster.status().get("audit_log"), variant="stage",
                      options={"availability_control": True, "rollback_via": "gitops", "source": None, "crds": None,
                               "user_built": False})
    lane = lane_class("a")(ctx)
    killed: dict = {}
    try:
        lane.deploy_v1()
        lane.deploy_v2()
        lane.wait_v1_scaled_down()
        assert lane.load is not None and lane.load.mesh is not None, "lane A's stage variant runs load"
        mesh = lane.load.mesh.name
        watch = RolloutWatch(kube, namespace, lane.drill.name)

        def kill_in_before():
            try:
                watch.wait("BEFORE's rollback in force (image v1)",
                           lambda ro: app_image(ro) == lane.drill.spec.image_v1, 300)
                killed["image"] = kill_registered(cluster, mesh)
            except BaseException as e:      # said by the case below
                killed["error"] = e
        side = threading.Thread(target=kill_in_before, daemon=True)
        side.start()
        lane.before()
        side.join(60)
        watch.stop()
        assert "error" not in killed, killed.get("error")
        assert "image" in killed, "the mesh emulator was not killed while BEFORE ran"
    finally:
        lane.close()
    rows = [r for r in ledger.rows if r["step"] == "before" and r["assertion"].startswith("load.")]
    cut = [r for r in rows if r["verdict"] == "inconclusive" and "mesh emulator exited" in (r["reason"] or "")]
    assert cut, rows
    # the phases that end after the emulator's death (the exposure and the settled phase) are judged by no figure
    judged = [r for r in rows if r["assertion"].split(".")[1] in ("exposure", "settled") and r not in cut]
    assert judged == [], judged
    assert world.leftovers(None, own_namespace=namespace) == []
    until("the cluster whole", lambda: cluster_whole(cluster), lambda broken: broken == [], timeout=60)
