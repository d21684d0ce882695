"""Lane A's live exit sends its abort only in the incident posture: the controller's non-zero weight in force on the
partly available revived ReplicaSet.  After a rollback the controller first writes its status (the revived hash, the
new generation observed) and scales; it keeps the weight at 0 while the revived ReplicaSet has no available pod and
writes the weight in a later reconcile.  An abort sent at "partly available" alone raced that write: a slow
controller (a loaded machine, an apiserver just restarted) wrote 5 after the abort and promote --full, and the exit's
weight-capped row failed against the 0 in force at promote --full ("canary weights after promote --full: [5, 0]").
Records as the recorder writes them, in the order the controller writes them."""
from __future__ import annotations

import copy

from drills.drill.shapes import RolloutSpec, manifests
from drills.lanes.a_live import _window_closed
from drills.record import timeline
from drills.record.recorder import _rollout
from drills.routers import istio

V1, V2 = "hash-v1", "hash-v2"


def _factory():
    """Record makers; each record's resourceVersion is the order it is made in."""
    m = manifests(RolloutSpec(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}], name="web", replicas=2), "ns1")
    seq = [0]

    def rec(kind, name, obj, type_="MODIFIED"):
        seq[0] += 1
        n = seq[0]
        return {"seq": n, "t": float(n), "wall": 1000.0 + n, "kind": kind, "type": type_, "name": name,
                "rv": str(n), "obj": obj}

    def ro(generation, observed, pod_hash):
        o = copy.deepcopy(m["rollout"])
        o["metadata"]["generation"] = generation
        o["status"] = {"observedGeneration": str(observed), "currentPodHash": pod_hash, "stableRS": V2,
                       "currentStepIndex": 2, "phase": "Progressing"}
        return rec("Rollout", "web", _rollout(o))

    def rs(available):
        return rec("ReplicaSet", f"web-{V1}", {"hash": V1, "spec_replicas": 2, "ready": available,
                                               "available": available})

    def weight(w):
        v = copy.deepcopy(m["routes"][1])
        v["spec"]["http"][0]["route"][0]["weight"], v["spec"]["http"][0]["route"][1]["weight"] = 100 - w, w
        return rec("VirtualService", "web", istio.condense_virtualservice(v))

    return (lambda: rec("Mark", "rollback", {}, "MARK")), ro, rs, weight


def _gate(records) -> bool:
    return timeline.weight_on_partial(timeline.derive(records, V1, since_mark="rollback"))


def test_partly_available_is_not_the_posture_until_the_controller_wrote_its_weight():
    mark, ro, rs, weight = _factory()
    records = [ro(6, 6, V2), rs(0), weight(0), mark(), ro(7, 6, V2),
               ro(7, 7, V1)]             # the controller's first answer: status (revived hash, generation observed)
    assert not _gate(records)
    records.append(rs(1))                # a revived pod available: the exit sent its abort here, with 0 in force
    d = timeline.derive(records, V1, since_mark="rollback")
    assert d.partial and d.partial[-1][1] is None and d.canary_weight[-1][1] == 0
    available, target = d.canary_available[-1][1:]
    assert 0 < available < target             # what the exit waited for before: true here, with 0 in force
    assert not _gate(records) and not _window_closed(d)
    records += [weight(5), ro(7, 7, V1)]      # the next reconcile: the weight on the partial ReplicaSet, its status
    assert _gate(records)
    assert not _gate([*records, rs(2)])       # fully available: no partial window any more


def test_the_window_closes_when_the_revived_replicaset_is_fully_available_after_the_rollback():
    mark, ro, rs, weight = _factory()
    d = timeline.derive([ro(6, 6, V2), rs(0), mark(), ro(7, 7, V1), rs(1), rs(2)], V1, since_mark="rollback")
    assert _window_closed(d) and not timeline.weight_on_partial(d)
    mark, ro, rs, weight = _factory()
    full_before = [ro(6, 6, V1), rs(2), mark(), ro(7, 6, V1)]   # fully available only before the rollback mark
    assert not _window_closed(timeline.derive(full_before, V1, since_mark="rollback"))
