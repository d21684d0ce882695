"""Live mode: lane A on an existing stage Rollout, reached through a kubeconfig, under the safety rules.

Refused (exit 2, nothing mutated) when the context is not allowlisted, the namespace lacks the opt-in
label, the Rollout is managed by Argo CD with automated self-heal (unless the sync is said to be paused),
another drill holds it (lease annotation), or the preconditions make the drill inconclusive anyway:
Rollout not Healthy or aborted, the rollback target ReplicaSet pruned, not scaled to 0, or outside
rollbackWindow.  Every mutation is journalled; restore runs on success, failure and signals.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kubernetes import client
from kubernetes import config as kconfig
from kubernetes.client.rest import ApiException

from . import config
from .ledger import INCONCLUSIVE, Ledger, exit_code, new_run_id
from .probe import ProbeSpec, RollbackDrill, steps_text
from .rollout import GROUP, HASH_LABEL, PLURAL, VERSION, Rollouts, healthy
from .safety import (Interrupted, Journal, RefusedTarget, SignalGuard, check_context, check_namespace,
                     restore_with_guard)

LEASE_ANNOTATION = "drills.dev/lease"
ARGOCD_TRACKING = ("argocd.argoproj.io/tracking-id", "argocd.argoproj.io/instance")


class LiveRefused(Exception):
    pass


def resolve_kubeconfig(path: str | None, context: str | None) -> tuple[str, str]:
    """As kubectl: --kubeconfig, else $KUBECONFIG, else ~/.kube/config; --context, else current-context."""
    kc = path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    if not Path(kc).exists():
        raise LiveRefused(f"kubeconfig {kc} does not exist")
    try:
        contexts, current = kconfig.list_kube_config_contexts(config_file=kc)
    except Exception as e:
        raise LiveRefused(f"kubeconfig {kc}: {e}")
    names = [c["name"] for c in contexts]
    ctx = context or (current or {}).get("name")
    if ctx not in names:
        raise LiveRefused(f"context {ctx!r} is not in {kc} (contexts: {', '.join(names)})")
    return kc, ctx


def controller_image_version(api) -> str:
    """The live controller's version: its image tag."""
    try:
        deps = client.AppsV1Api(api).list_deployment_for_all_namespaces(label_selector="app.kubernetes.io/name=argo-rollouts")
        items = deps.items or client.AppsV1Api(api).list_deployment_for_all_namespaces().items
    except ApiException:
        return "unknown"
    for d in items:
        for c in d.spec.template.spec.containers:
            if "argo-rollouts" in (c.image or "") or "rollouts-controller" in (c.name or ""):
                tag = c.image.rsplit(":", 1)[-1] if ":" in c.image else "unknown"
                return config.normalise_version(tag) or tag
    return "unknown"


def preflight(api, namespace: str, name: str, sync_paused: bool) -> dict:
    """Refuse (LiveRefused) when the drill would be unsafe or inconclusive anyway."""
    try:
        check_namespace(api, namespace)
    except RefusedTarget as e:
        raise LiveRefused(str(e))
    ro_api = Rollouts(api, namespace)
    try:
        ro = ro_api.get(name)
    except ApiException as e:
        raise LiveRefused(f"rollout {namespace}/{name}: {e.reason}")
    md = ro["metadata"]
    ann, labels = md.get("annotations") or {}, md.get("labels") or {}
    if ann.get(LEASE_ANNOTATION):
        raise LiveRefused(f"rollout {namespace}/{name} is held by another drill ({LEASE_ANNOTATION}="
                          f"{ann[LEASE_ANNOTATION]})")
    if any(k in ann or k in labels for k in ARGOCD_TRACKING) and not sync_paused:
        raise LiveRefused(f"rollout {namespace}/{name} is managed by Argo CD (self-heal would revert the drill): "
                          f"pause its sync and pass --sync-paused")
    st = ro.get("status") or {}
    if st.get("abort"):
        raise LiveRefused(f"rollout {namespace}/{name} is aborted")
    if not healthy()(ro):
        raise LiveRefused(f"rollout {namespace}/{name} is not Healthy (phase {st.get('phase')})")
    canary = (ro["spec"].get("strategy") or {}).get("canary")
    if canary is None or not canary.get("trafficRouting"):
        raise LiveRefused(f"rollout {namespace}/{name} is not a canary with traffic routing")
    window = (ro["spec"].get("rollbackWindow") or {}).get("revisions")
    if not window:
        raise LiveRefused(f"rollout {namespace}/{name} has no rollbackWindow: a rollback would walk the steps")
    try:
        target = ro_api.revision_replicaset(ro)
    except ValueError as e:
        raise LiveRefused(f"rollout {namespace}/{name}: the rollback target ReplicaSet is pruned ({e})")
    rss = ro_api.owned_replicasets(ro)
    stable = next((r for r in rss if (r.metadata.labels or {}).get(HASH_LABEL) == st.get("stableRS")), None)
    between = [r for r in rss if stable and target.metadata.creation_timestamp < r.metadata.creation_timestamp
               < stable.metadata.creation_timestamp]
    if stable is None or target.metadata.creation_timestamp >= stable.metadata.creation_timestamp \
            or len(between) >= window:
        raise LiveRefused(f"rollout {namespace}/{name}: the rollback target is outside rollbackWindow "
                          f"({len(between)} ReplicaSets between it and stable, window {window})")
    if (target.spec.replicas or 0) != 0 or (target.status.replicas or 0) != 0:
        raise LiveRefused(f"rollout {namespace}/{name}: the rollback target ReplicaSet "
                          f"{(target.metadata.labels or {}).get(HASH_LABEL)} still has pods (not scaled to 0)")
    return {"rollout": ro, "target": target, "stable": stable}


def run_live(args, log=None) -> int:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if not (args.namespace and args.rollout):
        raise LiveRefused("live mode needs --namespace and --rollout")
    kc, ctx = resolve_kubeconfig(args.kubeconfig, args.context)
    try:
        check_context(ctx, embedded=False, allow=args.allow_context)
    except RefusedTarget as e:
        raise LiveRefused(str(e))
    api = kconfig.new_client_from_config(config_file=kc, context=ctx)
    pre = preflight(api, args.namespace, args.rollout, args.sync_paused)
    ro = pre["rollout"]
    version = controller_image_version(api)
    run_id = new_run_id()
    run_dir = config.reports_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(run_dir, run_id, target=ctx, controller_version=version)
    journal = Journal(run_dir / "journal.json", kubeconfig=kc, context=ctx)
    steps = ro["spec"]["strategy"]["canary"]["steps"]
    template_v1 = client.ApiClient().sanitize_for_serialization(pre["target"].spec.template)
    template_v1["metadata"]["labels"].pop(HASH_LABEL, None)
    cut = [s for s in steps]
    while cut and "setWeight" in cut[-1] and cut[-1]["setWeight"] == 100:
        cut = cut[:-1]
    plan = [f"annotate {args.namespace}/{args.rollout} {LEASE_ANNOTATION}={run_id}",
            f"BEFORE: roll back the pod template to ReplicaSet {pre['target'].metadata.labels.get(HASH_LABEL)}",
            f"cut the steps [{steps_text(steps)}] -> [{steps_text(cut)}]",
            "redeploy the current image, wait for the rollback target to be scaled to 0",
            "AFTER: roll back again and observe",
            f"restore: image {ro['spec']['template']['spec']['containers'][0]['image']}, steps [{steps_text(steps)}]"]
    if args.dry_run:
        for p in plan:
            print(f"dry-run: would {p}")
        return 0
    spec = ProbeSpec(steps=steps, replicas=ro["spec"].get("replicas", 1), name=args.rollout,
                     availability_control=False, rollback_via=args.rollback_via,
                     image_v1=template_v1["spec"]["containers"][0]["image"],
                     image_v2=ro["spec"]["template"]["spec"]["containers"][0]["image"])
    drill = RollbackDrill(api, args.namespace, spec, run_dir / "live", journal=journal, log=log,
                          controller_version=version)
    drill.hash_v1 = pre["target"].metadata.labels.get(HASH_LABEL)
    drill.hash_v2 = ro["status"]["stableRS"]
    drill.live_template_v1 = template_v1
    co = client.CustomObjectsApi(api)
    journal.before_spec_change(ro)
    rc = 0
    load = None
    with SignalGuard():
        try:
            co.patch_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL, args.rollout,
                                              {"metadata": {"annotations": {LEASE_ANNOTATION: run_id}}})
            if args.service_url:
                from .lane_a import LaneLoad
                load = LaneLoad(None, args.namespace, args.rollout, run_dir / "load", url=args.service_url)
            _live_lane(drill, ledger, steps, cut, template_v1, load)
        except Interrupted as e:
            log(f"live drill {e}; restoring")
            ledger.record("a", "interrupted", "drill completed", "completed", str(e), INCONCLUSIVE,
                          reason=f"drill {e}")
            rc = 3
        except Exception as e:  # any failure: record it, restore, report
            log(f"live drill failed: {type(e).__name__}: {e}; restoring")
            ledger.record("a", "error", "drill completed", "completed", f"{type(e).__name__}: {e}", INCONCLUSIVE,
                          reason="the drill stopped before its evidence was complete")
            rc = 3
        finally:
            if load:
                load.close()
            drill.cleanup()
            ok = restore_with_guard(journal, api, log=log)
            try:
                co.patch_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL, args.rollout,
                                                  {"metadata": {"annotations": {LEASE_ANNOTATION: None}}})
            except ApiException:
                pass
            if not ok:
                rc = 1
    code = exit_code(ledger.rows)
    return max(rc, code) if rc != 1 and code != 1 else 1


def _live_lane(drill: RollbackDrill, ledger: Ledger, steps, cut, template_v1, load=None):
    from .lane_a import ASSERT_PEAK
    from .probe import last_set_weight

    def rollback(label):
        drill.recorder = None
        drill.run_label = label
        from . import timeline
        path = drill.evidence_dir / f"{label}.timeline.jsonl"
        drill.recorder = timeline.Recorder(drill.api, drill.ns, drill.name, path).start()
        if load:
            load.start(label)
        if drill.spec.rollback_via == "undo":
            res = drill.ro.undo(drill.name)
        else:
            res = drill.ro.gitops_rollback(drill.name, template_v1)
        drill.recorder.mark("rollback", rv=(res or {}).get("metadata", {}).get("resourceVersion"))
        try:
            drill.wait_settled()
        finally:
            extra = None
            if load and load.run:
                _, extra = load.phases(ledger, label, list(drill.recorder.records), drill.hash_v1)
                load.run = None
        return drill.finish(extra_series=extra)

    obs = rollback("before")
    v, r = obs.verdict(last_set_weight(steps))
    ledger.record("a", "before", ASSERT_PEAK, last_set_weight(steps), obs.peak_canary_weight_while_partial, v,
                  evidence=obs.timeline, reason=r, mode="live", series_text=obs.describe())
    drill.cut_steps(cut)
    drill.deploy(drill.spec.image_v2)
    drill.wait_scaled_to_zero(drill.hash_v1, timeout=600)
    obs = rollback("after")
    v, r = obs.verdict(last_set_weight(cut))
    ledger.record("a", "after", ASSERT_PEAK, last_set_weight(cut), obs.peak_canary_weight_while_partial, v,
                  evidence=obs.timeline, reason=r, mode="live", series_text=obs.describe())
    _ = json, time
