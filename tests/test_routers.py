"""drills.routers: one interface, one module per router; what each gives the manifests, the recorder, the timeline
and the mesh emulator, and the router as a run dimension (legs, rows, labels).  On the real controller:
tests/test_routers_cluster.py."""
from __future__ import annotations

import pytest

from drills.run import legs
from drills import routers
from drills.record import timeline
from drills.record.answer import controller_label
from drills.core.errors import BadInput
from drills.record.ledger import Ledger
from drills.traffic.mesh import Router, pod_info
from drills.record.recorder import _rollout
from drills.routers import istio, nginx
from drills.drill.shapes import RolloutSpec, manifests

HASH = "rollouts-pod-template-hash"


def _spec(**kw) -> RolloutSpec:
    return RolloutSpec(steps=[{"setWeight": 5}, {"pause": {"duration": "10s"}}, {"setWeight": 100}], name="web", **kw)


def test_dispatch_is_by_the_traffic_routing_key_as_the_controller_does():
    assert routers.of_canary({"trafficRouting": {"nginx": {"stableIngress": "x"}}}) is routers.NGINX
    assert routers.of_canary({"trafficRouting": {"istio": {"virtualService": {"name": "x"}}}}) is routers.ISTIO
    assert routers.of_canary({"trafficRouting": {"alb": {}}}) is None
    assert routers.of_canary({"trafficRouting": {"istio": {}}}) is routers.ISTIO      # a key with no fields: set
    assert routers.of_canary({"trafficRouting": {"istio": None}}) is None
    assert routers.of_canary({}) is None
    assert routers.of_record({}) is routers.ISTIO          # a timeline from before routers were a dimension
    assert routers.parse_names(None) == ["istio"]
    assert routers.parse_names("nginx,istio,nginx") == ["nginx", "istio"]
    assert routers.parse_names("all") == list(routers.NAMES) == routers.parse_names("all,istio")
    with pytest.raises(BadInput, match="choose from istio, nginx, or all"):
        routers.parse_names("traefik")
    with pytest.raises(BadInput, match="empty .an unset variable"):      # never taken for the default
        routers.parse_names(" , ")


def test_nginx_manifests_route_by_the_two_services_and_one_stable_ingress():
    m = manifests(_spec(router="nginx"), "ns1")
    canary = m["rollout"]["spec"]["strategy"]["canary"]
    assert canary["trafficRouting"] == {"nginx": {"stableIngress": "web"}}
    assert (canary["canaryService"], canary["stableService"]) == ("web-canary", "web-stable")
    assert [s["metadata"]["name"] for s in m["services"]] == ["web-canary", "web-stable"]
    (ing,) = m["routes"]
    assert ing["kind"] == "Ingress" and ing["apiVersion"] == "networking.k8s.io/v1"
    path = ing["spec"]["rules"][0]["http"]["paths"][0]
    assert path["backend"]["service"]["name"] == "web-stable"
    # the Istio manifests are what they were: one Service, the subsets and the route
    m = manifests(_spec(), "ns1")
    assert [o["kind"] for o in m["routes"]] == ["DestinationRule", "VirtualService"]
    assert m["rollout"]["spec"]["strategy"]["canary"]["trafficRouting"]["istio"]["destinationRule"]["name"] == "web"


def test_a_routing_the_router_lacks_is_bad_input_before_anything_is_created():
    with pytest.raises(BadInput, match="routing 'subset' is not one nginx has"):
        _spec(router="nginx", routing="subset")
    with pytest.raises(BadInput, match="router 'traefik'"):
        _spec(router="traefik")
    assert _spec(router="nginx").routing == "host" and _spec().routing == "subset"
    assert _spec(routing="host").on_router("nginx").routing == "host"
    assert _spec().on_router("nginx").routing == "host"


def _ingress(name: str, weight: int | None = None, total: int | None = None, host: str = "web.drills.local",
             service: str = "web-stable", prefix: str = nginx.DEFAULT_PREFIX) -> dict:
    ann = {}
    if weight is not None:
        ann = {f"{prefix}/canary": "true", f"{prefix}/canary-weight": str(weight)}
        if total is not None:
            ann[f"{prefix}/canary-weight-total"] = str(total)
    return {"metadata": {"name": name, "annotations": ann},
            "spec": {"rules": [{"host": host, "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}}


def test_nginx_weights_come_from_the_canary_ingress_the_controller_names():
    ro = _rollout(manifests(_spec(router="nginx"), "ns1")["rollout"])
    assert ro["router"] == "nginx" and ro["canaryIngresses"] == ["web-web-canary"]
    stable = nginx.condense_ingress(_ingress("web"))
    assert nginx.ROUTER.weights({"web": stable}, ro) == (0, 100)              # no canary Ingress yet
    canary = nginx.condense_ingress(_ingress("web-web-canary", 100, service="web-canary"))
    assert nginx.ROUTER.weights({"web": stable, "web-web-canary": canary}, ro) == (100, 0)
    scaled = nginx.condense_ingress(_ingress("web-web-canary", 50, total=200, service="web-canary"))
    assert nginx.ROUTER.weights({"web": stable, "web-web-canary": scaled}, ro) == (50, 150)   # as written
    other = nginx.condense_ingress(_ingress("other-canary", 100, service="web-canary"))
    assert nginx.ROUTER.weights({"web": stable, "other-canary": other}, ro) == (0, 100)   # not this Rollout's
    assert nginx.ROUTER.weights({}, ro) == (None, None)
    assert nginx.canary_ingress_name("r" * 250, "s") == "r" * 246 + "-canary"


def test_the_timeline_reads_each_router_through_its_own_records():
    ro = _rollout(manifests(_spec(router="nginx"), "ns1")["rollout"])
    ro["status"].update(currentStepIndex=0)

    def rec(seq, kind, name, obj):
        return {"seq": seq, "t": float(seq), "wall": 1000.0 + seq, "kind": kind, "type": "ADDED", "name": name,
                "rv": str(seq), "obj": obj}
    records = [rec(1, "Rollout", "web", ro), rec(2, "Ingress", "web", nginx.condense_ingress(_ingress("web"))),
               rec(3, "Ingress", "web-web-canary",
                   nginx.condense_ingress(_ingress("web-web-canary", 5, service="web-canary"))),
               rec(4, "Ingress", "web-web-canary",
                   nginx.condense_ingress(_ingress("web-web-canary", 100, service="web-canary")))]
    d = timeline.derive(records, canary_hash=None)
    assert [w for _, w in d.canary_weight] == [0, 5, 100]
    # an Istio timeline written before routers were a dimension (no "router" in the Rollout record) reads as before
    old = _rollout(manifests(_spec(), "ns1")["rollout"])
    old.pop("router")
    vs = manifests(_spec(), "ns1")["routes"][1]
    vs["spec"]["http"][0]["route"][1]["weight"] = 40
    d = timeline.derive([rec(1, "Rollout", "web", old), rec(2, "VirtualService", "web", istio.condense_virtualservice(vs))],
                        canary_hash=None)
    assert [w for _, w in d.canary_weight] == [40]


def _pod(name: str, h: str, labels: dict) -> dict:
    return {"metadata": {"name": name, "labels": {**labels, HASH: h}},
            "spec": {"containers": [{"name": "app", "image": f"registry.local/web:{h}"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def _service(name: str, h: str | None) -> dict:
    sel = {"app": "web", **({HASH: h} if h else {})}
    return {"metadata": {"name": name}, "spec": {"selector": sel}}


def test_the_mesh_sends_the_canary_ingress_share_to_the_canary_service_pods():
    services = {"web-stable": _service("web-stable", "aaa"), "web-canary": _service("web-canary", "bbb")}
    ingresses = {"web": _ingress("web"), "web-web-canary": _ingress("web-web-canary", 25, service="web-canary"),
                 "elsewhere": _ingress("elsewhere", 100, host="other.local", service="web-canary"),
                 "a-foreign-canary": _ingress("a-foreign-canary", 100, service="web-stable")}
    table = nginx.route_table(ingresses, services, "web")       # the controller's canary Ingress, not a foreign one
    assert [(r.host, r.weight, r.labels.get(HASH)) for r in table] == [("web-stable", 75, "aaa"),
                                                                        ("web-canary", 25, "bbb")]
    r = Router(1e6)
    r.routes = table
    r.set_pods({p.name: p for p in map(pod_info, [_pod("s1", "aaa", {"app": "web"}), _pod("c1", "bbb", {"app": "web"})])})
    hits = [r.decide(1000.0 + i / 1000).revision for i in range(2000)]
    assert 0.20 < hits.count("bbb") / len(hits) < 0.30
    # a Service the route names but the cluster lacks: no cluster (503), never a pod of another Service
    table = nginx.route_table(ingresses, {"web-stable": services["web-stable"]}, "web")
    assert table[1].labels is None
    r.routes = [table[1]]
    assert r.decide(2000.0).flags == "NC"
    assert nginx.route_table({}, services, "web") == []


def test_istio_host_routes_resolve_to_their_service_pods():
    vs = manifests(_spec(routing="host"), "ns1")["routes"][0]
    services = {"web-stable": _service("web-stable", "aaa"), "web-canary": _service("web-canary", "bbb")}
    table = istio.route_table(vs, None, services)
    assert [(r.host, r.weight, r.labels[HASH]) for r in table] == [("web-stable", 100, "aaa"), ("web-canary", 0, "bbb")]


def test_nginx_metrics_are_shaped_as_ingress_nginx_exports_them():
    r = Router(1e6)
    r.routes = nginx.route_table({"web": _ingress("web")}, {"web-stable": _service("web-stable", "aaa")}, "web")
    r.set_pods({"s1": pod_info(_pod("s1", "aaa", {"app": "web"}))})
    m = nginx.ROUTER.metrics("ns1", "web")
    for i in range(3):
        m.observe(r.decide(1000.0 + i), 1.0)
    text = m.render()
    assert ('nginx_ingress_controller_requests{namespace="ns1",ingress="web",service="web-stable",canary="",'
            'status="200",revision="aaa"} 3') in text


def test_the_router_is_a_run_dimension_of_legs_rows_and_labels(tmp_path):
    plan = legs.plan(["v1.8.2"], ["a", "b"], router_names=["istio", "nginx"])
    assert [x.id for x in plan] == ["v1.8.2/a/stage", "v1.8.2/a/stage/nginx", "v1.8.2/b/stage"]
    assert plan[1].to_dict()["router"] == "nginx" and plan[0].to_dict()["router"] == "istio"
    with pytest.raises(BadInput, match="none of the lanes b runs on it"):
        legs.plan(["v1.8.2"], ["b"], router_names=["nginx"])
    assert [x.id for x in legs.plan(["v1.8.2"], ["a", "b"], router_names=["nginx"])] == ["v1.8.2/a/stage/nginx"]
    with pytest.raises(BadInput, match="lane b runs on istio, not on nginx"):      # b named by itself: refused
        legs.plan(["v1.8.2"], ["a", "b"], router_names=["nginx"], named=True)
    # `all` routers: each lane on the routers it runs on, never refused for one of them
    opts = legs.router_options("b", "all")
    assert [x.id for x in legs.plan(["v1.8.2"], ["b"], **opts)] == ["v1.8.2/b/stage"]
    assert legs.router_options("all,a", "nginx")["named"] is False and legs.router_options("a,b", None)["named"]
    assert legs.split_router("v1.8.2/a/stage/nginx") == ("v1.8.2/a/stage", "nginx")
    assert legs.split_router("v1.8.2/a/stage") == ("v1.8.2/a/stage", "istio")
    led = Ledger(tmp_path, "r1", "embedded", "v1.8.2", router="nginx")
    row = led.record("a", "before", "peak", 100, 100, "pass", key="peak-weight")
    assert row["router"] == "nginx"
    assert controller_label(row) == "v1.8.2 on nginx"
    istio_row = Ledger(tmp_path, "r1", "embedded", "v1.8.2").record("a", "before", "peak", 100, 100, "pass")
    assert controller_label(istio_row) == "v1.8.2"
    # a row written without its leg (a killed leg's) belongs to the leg of its router only
    orphans = [dict(row, leg=None), dict(istio_row, leg=None)]
    for leg in plan[:2]:
        got = legs.rows_of(orphans, leg.to_dict())
        assert [r["router"] for r in got] == [leg.router], (leg.id, got)


def _nginx_rollout(**canary_over) -> dict:
    canary = {"canaryService": "c", "stableService": "s", "minPodsPerReplicaSet": 1,
              "trafficRouting": {"nginx": {"stableIngress": "web"}},
              "steps": [{"setWeight": 5}, {"pause": {"duration": "10s"}}, {"setWeight": 100}]}
    canary.update(canary_over)
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"replicas": 2, "rollbackWindow": {"revisions": 3}, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                         {"name": "app", "image": "x:1"}]}}, "strategy": {"canary": canary}}}


@pytest.mark.parametrize("over, why", [
    ({"canaryService": None}, "without both canaryService and stableService"),
    ({"trafficRouting": {"nginx": {}}}, "neither of stableIngress and stableIngresses"),
    ({"trafficRouting": {"nginx": {"stableIngress": "a", "stableIngresses": ["b"]}}},
     "both of stableIngress and stableIngresses"),
])
def test_the_scan_refuses_an_nginx_routing_the_controller_refuses(over, why, tmp_path):
    """The controller's validation (InvalidSpec, Degraded, nothing reconciled; seen on v1.8.2): no exposure is
    predicted for a Rollout that never rolls out, and the lint says why."""
    from drills.scan.advice import INVALID_SPEC, lint
    from drills.scan.model import from_object
    from drills.scan.predict import predict
    from drills.scan.sources import facts_for
    ro = from_object(_nginx_rollout(**over), "x.yaml")
    pred = predict(ro, facts_for("v1.8.2"))
    assert pred.rule == "invalid-spec" and why in pred.text and pred.peak is None, pred
    assert [f.rule for f in lint(ro, facts_for("v1.8.2")) if f.rule == INVALID_SPEC] == [INVALID_SPEC]
    good = predict(from_object(_nginx_rollout(), "x.yaml"), facts_for("v1.8.2"))
    assert good.rule != "invalid-spec" and good.peak == 100
    # `istio: {}` is Istio, as the controller checks the field is set
    assert from_object(_nginx_rollout(trafficRouting={"istio": {}}, canaryService=None, stableService=None),
                       "x.yaml").router == "istio"
