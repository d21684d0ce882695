"""What stands between a live drill and its Rollout failing: the API becoming unreachable or silent mid-drill
(a TCP proxy on 127.0.0.1 in front of the apiserver that the case cuts or freezes; the drill's kubeconfig points at
the proxy), another writer changing the Rollout during the drill, and a second drill on the same Rollout."""
from __future__ import annotations

import time

import pytest
from checks import lease_of, rollout_writes
from faultkit import ApiProxy, api_address, app_image, steps_of

from drills.drill import safety
from drills.kube.api import new_client
from drills.kube.rollout import Rollouts

pytestmark = pytest.mark.single_version

# the drill's DRILLS_REQUEST_TIMEOUT: short, so the lost API is noticed soon; not so short that a loaded machine's
# apiserver misses it in the preflight, before the API is lost (2 s did once, run s69)
REQUEST_TIMEOUT_S = 5
OTHER_AGENT = "other-writer/1.0"


@pytest.mark.parametrize("mode,phase", [pytest.param("cut", "before", id="api-unreachable-during-before"),
                                        pytest.param("silence", "after", id="api-silent-during-after")])
def test_live_api_lost_mid_drill_keeps_lease_and_journal_for_restore(stage, cluster, mode, phase):
    s = stage()
    proxy = ApiProxy(api_address(cluster))
    try:
        kc = proxy.kubeconfig(cluster.kubeconfig, s.tmp / "via-proxy.kubeconfig")
        if phase == "before":
            s.hold(s.d.hash_v1)
        drill = s.live(kubeconfig=kc, env={"DRILLS_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)})
        if phase == "after":
            s.reach("redeploy", drill)
            s.hold(s.d.hash_v1)
        s.reach(phase, drill)
        getattr(proxy, mode)()
        rc = drill.wait(300)
        assert rc not in (0, None), drill.tail()
        assert "Traceback" not in drill.console, drill.tail()
        # the drill said it could not finish, and how to finish it: the lease names the journal
        lease = lease_of(s.kube, s.ns, s.name)
        assert lease.get("journal") and f"drills restore --journal {lease['journal']}" in drill.console, \
            (lease, drill.tail())
        assert safety.Journal.load(lease["journal"]).state != "restored"
        s.assert_no_pass_from(phase)
        proxy.restore()
        s.release()
        r = s.restore(lease["journal"])
        assert r.returncode == 0, r.stderr
        s.assert_restored()
    finally:
        proxy.close()
    s.assert_nothing_left()


# --- another writer ---------------------------------------------------------------------------------------
def _other(cluster, namespace: str) -> Rollouts:
    """Someone else's client (its own user agent, so the audit log tells its writes from the drill's)."""
    return Rollouts(new_client(cluster.kubeconfig, agent=OTHER_AGENT), namespace)


@pytest.mark.parametrize("phase", [pytest.param("before", id="other-writer-image-during-before")])
def test_other_writer_changes_the_image_the_drill_stops_and_never_overwrites_it(stage, cluster, phase):
    """A deploy by someone else lands while BEFORE runs."""
    s = stage()
    s.hold(s.d.hash_v1)
    drill = s.live()
    s.reach("before", drill)
    moved = _other(cluster, s.ns).set_image(s.name, "registry.local/svc:v3", container="app")
    rc = drill.wait()
    assert rc not in (0, None), drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    assert "another writer" in drill.console and "moved on" in drill.console and "svc:v3" in drill.console, \
        drill.tail()
    now = Rollouts(s.kube, s.ns).get(s.name)
    assert app_image(now) == "registry.local/svc:v3" and steps_of(now) == s.steps
    assert now["spec"]["template"] == moved["spec"]["template"]
    # nothing of the drill's reached the Rollout after the other writer's change
    audit = s.cluster.status()["audit_log"]
    theirs = rollout_writes(audit, s.ns, s.name, OTHER_AGENT)
    assert theirs, "the other writer's change is in the audit log"
    after = [w for w in rollout_writes(audit, s.ns, s.name, "drills/") if w["time"] > theirs[0]["time"]]
    assert after == [], after
    # the restore is owed and named: the lease and the journal stay; `drills restore` refuses (moved on)
    lease = lease_of(s.kube, s.ns, s.name)
    assert lease.get("journal") and lease["journal"] in drill.console, (lease, drill.tail())
    s.assert_no_pass_from("before")
    r = s.restore(lease["journal"])
    assert r.returncode == 2 and "moved on" in r.stderr, r.stderr
    s.release()
    s.assert_nothing_left()


@pytest.mark.parametrize("phase", [pytest.param("after", id="other-writer-scale-during-after")])
def test_other_writer_scales_the_drill_stops_restores_its_own_changes_only(stage, cluster, phase):
    """Replicas changed by someone else while AFTER runs on the cut steps."""
    s = stage()
    drill = s.live()
    s.reach("redeploy", drill)
    s.hold(s.d.hash_v1)
    s.reach("after", drill)
    _other(cluster, s.ns).scale(s.name, 3)
    s.release()
    assert drill.wait() == 3, drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    assert "another writer" in drill.console and "spec.replicas" in drill.console, drill.tail()
    s.assert_restored(replicas=3)       # template and steps as before; the other writer's replicas kept
    s.assert_no_pass_from("after")
    s.assert_nothing_left()


# --- two drills on one Rollout ----------------------------------------------------------------------------
@pytest.mark.parametrize("phase", [pytest.param("before", id="second-drill-during-before")])
def test_second_drill_on_a_leased_rollout_is_refused_and_sends_nothing(stage, cluster, phase):
    s = stage()
    s.hold(s.d.hash_v1)
    first = s.live()
    s.reach("before", first)
    journal = lease_of(s.kube, s.ns, s.name)["journal"]
    since = time.time()
    second = s.live()
    assert second.wait() == 2, second.tail()
    assert "held by another drill" in second.console and journal in second.console, second.tail()
    # the first drill is held in BEFORE (it only reads): every write since is the second drill's; there is none
    assert rollout_writes(s.cluster.status()["audit_log"], s.ns, s.name, "drills/", since) == []
    s.release()
    assert first.wait() == 0, first.tail()
    s.assert_restored()
    s.assert_nothing_left()


@pytest.mark.parametrize("phase", [pytest.param("preflight", id="two-drills-during-preflight")])
def test_two_drills_started_together_exactly_one_runs(stage, phase):
    """Both read the Rollout free of a lease; only one may take it."""
    s = stage()
    a, b = s.live(), s.live()
    codes = sorted([a.wait(), b.wait()])
    assert codes == [0, 2], (codes, a.tail(), b.tail())
    refused = a if a.proc.returncode == 2 else b
    assert "held by another drill" in refused.console, refused.tail()
    s.assert_restored()
    s.assert_nothing_left()
