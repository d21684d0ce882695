"""Flight-recorder latency: from a VirtualService write to its timeline row, over >= 200 weight changes.

    python benchmarks/bench_recorder.py [--changes 250] [--interval 0.02]

Uses the embedded cluster that is up (or brings one up).  The writes are full Updates of
spec.http[0].route[*].weight, as the controller does them.  Latency = time the timeline row was written
minus the time the write was sent (an upper bound: it includes the write's own round trip); the figure
from the write's response is printed too.  Target: p99 <= 50 ms, 0 missed.
"""
from __future__ import annotations

import argparse
import time
import uuid

from kubernetes import client

from drills.record import recorder
from drills.cluster import EmbeddedCluster
from drills.cluster.namespaces import drop_namespace, make_namespace


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
    make_namespace(api, ns)
    co = client.CustomObjectsApi(api)
    g = ("networking.istio.io", "v1alpha3", ns, "virtualservices")
    vs = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService", "metadata": {"name": "web"},
          "spec": {"hosts": ["web"], "http": [{"name": "primary", "route": [
              {"destination": {"host": "web", "subset": "stable"}, "weight": 100},
              {"destination": {"host": "web", "subset": "canary"}, "weight": 0}]}]}}
    co.create_namespaced_custom_object(*g, vs)
    rec = recorder.Recorder(api, ns, "none", f"/tmp/{ns}.timeline.jsonl", audit_log=c.status().get("audit_log"))
    rec.start()
    sent = {}
    try:
        for i in range(args.changes):
            obj = co.get_namespaced_custom_object(*g, "web")
            w = (i * 7) % 101
            obj["spec"]["http"][0]["route"][0]["weight"] = 100 - w
            obj["spec"]["http"][0]["route"][1]["weight"] = w
            t_send = time.time()
            res = co.replace_namespaced_custom_object(*g, "web", obj)
            sent[res["metadata"]["resourceVersion"]] = (t_send, time.time())
            time.sleep(args.interval)
        time.sleep(1.0)
    finally:
        result = rec.stop()
        drop_namespace(api, ns)
    rows = {r["rv"]: r["wall"] for r in rec.records if r["kind"] == "VirtualService"}
    upper = [(rows[rv] - ts) * 1000 for rv, (ts, _) in sent.items() if rv in rows]
    after = [(rows[rv] - tr) * 1000 for rv, (_, tr) in sent.items() if rv in rows]
    missed = [rv for rv in sent if rv not in rows]
    print(f"{len(sent)} VirtualService writes, {len(upper)} rows matched, {len(missed)} missed; "
          f"audit-log check: {result['audit_writes_checked']} writes, complete={result['complete']}")
    print(f"write sent -> timeline row (upper bound: includes the write's own round trip): p50 "
          f"{pct(upper, 50):.1f} ms  p99 {pct(upper, 99):.1f} ms  max {max(upper):.1f} ms  "
          f"(target p99 <= 50 ms, 0 missed)")
    print(f"write response -> timeline row (negative: the row was written before the writer saw its response): "
          f"p50 {pct(after, 50):.1f} ms  p99 {pct(after, 99):.1f} ms")


if __name__ == "__main__":
    main()
