"""Flight-recorder latency: from a VirtualService write to its timeline row, over >= 200 weight changes.

    python benchmarks/bench_recorder.py [--changes 250] [--interval 0.02]

Uses the embedded cluster that is up (or brings one up).  The writes are full Updates of
spec.http[0].route[*].weight, as the controller does them.  Latency = time the timeline row was written
minus the time the write's response came back (an upper bound of the commit time, so the figure is
conservative by the response's own transit).  Target: p99 <= 50 ms, 0 missed.
"""
from __future__ import annotations

import argparse
import time
import uuid

from kubernetes import client

from drills import timeline
from drills.cluster import EmbeddedCluster
from drills.pytest_plugin import _drop_namespace, _make_namespace


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=250)
    ap.add_argument("--interval", type=float, default=0.02)
    args = ap.parse_args()
    c = EmbeddedCluster(log=lambda m: None)
    if not c.status().get("ready"):
        c.up()
    api = c.api_client()
    ns = f"bench-rec-{uuid.uuid4().hex[:5]}"
    _make_namespace(api, ns)
    co = client.CustomObjectsApi(api)
    g = ("networking.istio.io", "v1alpha3", ns, "virtualservices")
    vs = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService", "metadata": {"name": "web"},
          "spec": {"hosts": ["web"], "http": [{"name": "primary", "route": [
              {"destination": {"host": "web", "subset": "stable"}, "weight": 100},
              {"destination": {"host": "web", "subset": "canary"}, "weight": 0}]}]}}
    co.create_namespaced_custom_object(*g, vs)
    rec = timeline.Recorder(api, ns, "none", f"/tmp/{ns}.timeline.jsonl", audit_log=c.status().get("audit_log"))
    rec.start()
    sent = {}
    try:
        for i in range(args.changes):
            obj = co.get_namespaced_custom_object(*g, "web")
            w = (i * 7) % 101
            obj["spec"]["http"][0]["route"][0]["weight"] = 100 - w
            obj["spec"]["http"][0]["route"][1]["weight"] = w
            res = co.replace_namespaced_custom_object(*g, "web", obj)
            sent[res["metadata"]["resourceVersion"]] = time.time()
            time.sleep(args.interval)
        time.sleep(1.0)
    finally:
        result = rec.stop()
        _drop_namespace(api, ns)
    rows = {r["rv"]: r["wall"] for r in rec.records if r["kind"] == "VirtualService"}
    lat = [(rows[rv] - t) * 1000 for rv, t in sent.items() if rv in rows]
    missed = [rv for rv in sent if rv not in rows]
    print(f"{len(sent)} VirtualService writes, {len(lat)} rows matched, {len(missed)} missed; "
          f"audit-log check: {result['audit_writes_checked']} writes, complete={result['complete']}")
    print(f"write -> timeline row latency: p50 {pct(lat, 50):.1f} ms  p99 {pct(lat, 99):.1f} ms  "
          f"max {max(lat):.1f} ms  (target p99 <= 50 ms, 0 missed)")


if __name__ == "__main__":
    main()
