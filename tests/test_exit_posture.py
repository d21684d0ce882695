"""Lane A's live exit sends its abort only in the incident posture: the revived ReplicaSet partly available AND the
weight in force the controller's answer to the rollback.  A slow controller (a loaded machine, an apiserver just
restarted) has the revived ReplicaSet scaled, then partly available, before its reconcile writes the route: a weight
read then is the one from before the rollback, and judging promote --full against it reads the controller's own
answer to the rollback (5) as a rise after promote --full, a false fail (seen on a loaded machine: the exit's
weight-capped row failed with "canary weights after promote --full: [5, 0]").  Records as the recorder writes them."""
from __future__ import annotations

import copy

from drills.drill.shapes import RolloutSpec, manifests
from drills.lanes.a_live import _partly_available, _window_closed
from drills.record import timeline
from drills.record.recorder import _rollout
from drills.routers import istio

V1, V2 = "hash-v1", "hash-v2"


def _records():
    spec = RolloutSpec(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}], name="web", replicas=2)
    m = manifests(spec, "ns1")
    vs = m["routes"][1]
    seq = [0]

    def rec(kind, name, obj):
        seq[0] += 1
        n = seq[0]
        return {"seq": n, "t": float(n), "wall": 1000.0 + n, "kind": kind, "type": "MODIFIED", "name": name,
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
        v = copy.deepcopy(vs)
        v["spec"]["http"][0]["route"][0]["weight"], v["spec"]["http"][0]["route"][1]["weight"] = 100 - w, w
        return rec("VirtualService", "web", istio.condense_virtualservice(v))

    def mark():
        r = rec("Mark", "rollback", {})
        r["type"] = "MARK"
        return r

    return mark, ro, rs, weight


def test_partly_available_before_the_controller_wrote_its_answer_is_not_the_posture():
    mark, ro, rs, weight = _records()          # (each record's resourceVersion is the order it is made in)
    records = [ro(6, 6, V2), rs(0), weight(0), mark(), ro(7, 6, V2), rs(1)]   # the rollback's write, the RS 1/2
    d = timeline.derive(records, V1, since_mark="rollback")
    assert _partly_available(d) and not d.answered and not _window_closed(d)
    records += [weight(5), ro(7, 7, V1)]                   # the controller's reconcile: the route, then its status
    d = timeline.derive(records, V1, since_mark="rollback")
    assert _partly_available(d) and d.answered and d.canary_weight[-1][1] == 5


def test_a_status_of_another_generation_or_replicaset_is_no_answer():
    for late in ((7, 6, V1), (7, 7, V2)):                   # not yet observed / not the revived ReplicaSet
        mark, ro, rs, weight = _records()
        d = timeline.derive([ro(6, 6, V2), rs(0), mark(), ro(*late), rs(1)], V1, since_mark="rollback")
        assert not d.answered
    mark, ro, rs, weight = _records()
    d = timeline.derive([ro(6, 6, V1), rs(0), mark(), rs(1)], V1, since_mark="rollback")
    assert not d.answered                                   # before the rollback: not its answer


def test_the_window_closes_when_the_revived_replicaset_is_fully_available_after_the_rollback():
    mark, ro, rs, weight = _records()
    d = timeline.derive([ro(6, 6, V2), rs(0), mark(), ro(7, 6, V2), rs(1), rs(2)], V1, since_mark="rollback")
    assert _window_closed(d) and not d.answered and not _partly_available(d)
    mark, ro, rs, weight = _records()
    full_before = [ro(6, 6, V2), rs(2), mark(), ro(7, 6, V2)]   # fully available only before the rollback mark
    assert not _window_closed(timeline.derive(full_before, V1, since_mark="rollback"))
