"""The external metrics API a drill serves on loopback (drills.cluster.external_metrics), read through the real
kube-apiserver's aggregator, one registration per cluster, removed when it stops; and the HPA the scale-out uses
(drills.drill.autoscale), acted on by the cluster's real HPA controller.  The scale-out during a rollback itself is lane
order's step (lanes/order)."""
from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from drills.drill.autoscale import HPAScaleOut, external_metrics_for, hpa_manifest, metric_name
from drills.cluster.external_metrics import API_SERVICE, GROUP, VERSION, ExternalMetricsError
from drills.drill.kit import DrillRollout
from drills.drill.shapes import RolloutSpec


def _raw(kube, path: str) -> dict:
    data = kube.call_api(path, "GET", _preload_content=False, auth_settings=["BearerToken"],
                         _request_timeout=10).data
    return json.loads(data)


def test_the_aggregator_serves_the_drills_values_one_registration_at_a_time(kube, cluster, namespace):
    reg = client.ApiregistrationV1Api(kube)
    with external_metrics_for(cluster, kube, True) as m:
        m.set(namespace, "drills-load-x", 7)
        got = _raw(kube, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/drills-load-x")
        assert [(i["metricName"], i["value"]) for i in got["items"]] == [("drills-load-x", "7000m")]
        assert _raw(kube, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/unset")["items"] == []
        assert m.reads_of(namespace, "drills-load-x")[-1][1] == 7.0
        with pytest.raises(ExternalMetricsError, match="another drill"):
            external_metrics_for(cluster, kube, True).start()
        assert reg.read_api_service(API_SERVICE).spec.service.port == m.port      # the refused one changed nothing
    with pytest.raises(ApiException) as e:
        reg.read_api_service(API_SERVICE)
    assert e.value.status == 404
    with external_metrics_for(cluster, kube, False) as nothing:
        assert nothing is None


def test_the_hpa_controller_scales_the_rollout_when_the_metric_rises(kube, cluster, namespace,
                                                                                     tmp_path, controller_version):
    spec = RolloutSpec(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}], replicas=2, name="hpa",
                       image_v1="registry.local/hpa:v1", image_v2="registry.local/hpa:v2")
    d = DrillRollout(kube, namespace, spec, tmp_path / "drill", controller_version=controller_version)
    d.deploy_v1()
    assert hpa_manifest(namespace, "hpa", 2, 5)["spec"]["behavior"]["scaleDown"] == {"selectPolicy": "Disabled"}
    with external_metrics_for(cluster, kube, True) as m:
        hpa = HPAScaleOut(kube, m, namespace, "hpa", 2, 5)
        try:
            hpa.start()                              # the HPA controller has read the metric (ScalingActive)
            assert d.ro.get("hpa")["spec"]["replicas"] == 2
            assert m.reads_of(namespace, metric_name("hpa"))
            hpa.raise_load()
            got = hpa.wait_scaled(d.ro)
            assert d.ro.get("hpa")["spec"]["replicas"] == 5 and got["status"]["desiredReplicas"] == 5
            with pytest.raises(ValueError):
                m.set(namespace, metric_name("hpa"), float("nan"))
        finally:
            hpa.stop()
    d.cleanup()
