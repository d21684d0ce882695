"""Lane B runbook: the base chart path, verified without live traffic (brief §9.4, §14.3).

Steps, in order: (1) render equivalence of 3.0.13 vs 3.0.14-rc.0 for every app, (2) publishing
3.0.14-rc.0 alone (no service bumped) changes no rendered manifest, (3) bumping one inheritor changes that
service only.  Everything runs on working copies of fixtures/fleet; the registry is the real `registry`
served on 127.0.0.1.
"""
from __future__ import annotations

from drills.renderdiff import (Fleet, check_equivalence, check_merge_alone, check_propagation, inheritors,
                               record_step)

PINNED = "3.0.13"
CANDIDATE = "3.0.14-rc.0"
LANE_ENV = "stage"


def test_step1_render_equivalence(helm, ledger, tmp_path):
    fleet = Fleet()
    results = [check_equivalence(fleet, env, PINNED, CANDIDATE, helm, tmp_path / env) for env in fleet.envs()]
    ok = all(r.ok for r in results)
    record_step(ledger, "render-equivalence",
                f"helm template {PINNED} vs {CANDIDATE}: inheritors change only the Rollout's canary steps "
                "(final setWeight 100 removed), other apps nothing, chart-version restatements aside",
                expected={"unexpected": []}, observed={"unexpected": [u for r in results for u in r.unexpected],
                                                       "summary": [r.describe() for r in results]},
                ok=ok, evidence={"envs": [r.to_dict() for r in results]})
    assert ok, "; ".join(r.describe() for r in results)


def test_step2_merge_alone_changes_no_service(helm, registry, ledger, tmp_path):
    res = check_merge_alone(Fleet(), LANE_ENV, CANDIDATE, helm, registry, tmp_path)
    record_step(ledger, "merge-alone",
                f"publishing base {CANDIDATE} to the registry, no service bumped, then helm dependency update: "
                "no rendered manifest changes",
                expected={"changed_apps": []},
                observed={"changed_apps": res.changed_apps, "registry_tags": res.registry_tags,
                          "vendored_after": res.vendored_after, "precondition": res.precondition},
                ok=res.ok, evidence=res.to_dict())
    assert res.ok, res.describe()


def test_step3_propagation_to_one_inheritor(helm, registry, ledger, tmp_path):
    fleet = Fleet()
    service = inheritors(fleet, LANE_ENV, helm, tmp_path / "probe", PINNED)[0]
    res = check_propagation(fleet, LANE_ENV, service, CANDIDATE, helm, registry, tmp_path / "run")
    record_step(ledger, "propagation",
                f"bumping {service} to base {CANDIDATE} (Chart.yaml edit + helm dependency update) "
                "changes that service only",
                expected={"changed_apps": [service]},
                observed={"changed_apps": res.changed_apps,
                          "changed": res.diffs[service].to_dict()["changed"],
                          "chart_version_only": res.diffs[service].to_dict()["chart_version_only"]},
                ok=res.ok, evidence=res.to_dict(), service=service)
    assert res.ok, res.describe()


def test_step4_first_real_deploy_of_the_bumped_inheritor(kube, cluster, namespace, helm, registry, ledger,
                                                         evidence_dir, tmp_path):
    from drills.lane_b import first_deploy
    from drills.renderdiff import Workspace, ensure_published
    fleet = Fleet()
    service = inheritors(fleet, LANE_ENV, helm, tmp_path / "probe", PINNED)[0]
    for version in (PINNED, CANDIDATE):
        ensure_published(helm, registry, version, tmp_path / "pkg")
    ws = Workspace(fleet, tmp_path / "ws", helm, registry.url)
    app = ws.fleet.app(service, LANE_ENV)
    rows = first_deploy(kube, namespace, ws, app, CANDIDATE, ledger, evidence_dir / "lane-b",
                        audit_log=cluster.status().get("audit_log"))
    bad = [r for r in rows if r["verdict"] not in ("pass", "not_applicable")]
    assert not bad, "; ".join(f"{r['assertion']}: expected {r['expected']}, observed {r['observed']}" for r in bad)
