"""Live mode: lane A on an existing stage Rollout, reached through a kubeconfig, under the safety rules.

Every input is checked before the first request that mutates anything; then a read-only preflight refuses
(exit 2, nothing mutated) when the context is not allowlisted, the namespace lacks the opt-in label, the
Rollout is managed by Argo CD (its tracking annotation or label, including Argo CD's default tracking label
``app.kubernetes.io/instance``) unless the sync is said to be paused, another drill holds it (lease
annotation), the drill cannot handle its shape (no pod template, no canary steps, no traffic routing, no
single application container), or the preconditions make the drill inconclusive anyway: Rollout not Healthy
or aborted, the rollback target ReplicaSet pruned, not scaled to 0, or outside rollbackWindow.

The drill changes only the application container's image (named with --container, or found: see
drills.core.podtemplate.app_container_name).  Every mutation is journalled; restore runs on success, failure and
signals, and the lease stays on the Rollout until a restore finished.
"""
from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass

from ..kube import k8s
from ..kube.k8s import client

from ..core import config
from ..kube import api as kube
from .. import routers
from ..kube.kubeconfig import server_of
from ..core.errors import BadInput, Refused
from ..drill.kit import DrillRollout
from ..lanes.a_live import LiveLaneA
from ..lanes.b_live import LiveLaneB
from ..lanes.base import LaneContext
from ..record.ledger import INCONCLUSIVE, Ledger, exit_code, new_run_id
from ..core.names import plain_name
from ..traffic.phases import PhasedLoad
from ..core.podtemplate import (
    RolloutShapeError, app_container_name, container_images, reverted_template, selector_string, template_differences
)
from ..kube.rollout import HASH_LABEL, RESYNC_ANNOTATION, Rollouts, healthy
from ..drill.safety import (
    LEASE_ANNOTATION, Interrupted, Journal, SignalGuard, check_context, check_namespace, describe_lease, lease_value,
    restore_with_guard, take_lease
)
from ..drill.shapes import RolloutSpec
from ..core.steps import cut_final_full_weight, steps_text
from ..drill.watchdog import Watchdog, api_answers, no_other_writer

ARGOCD_TRACKING_ANNOTATIONS = ("argocd.argoproj.io/tracking-id",)
# Argo CD tracks resources by a label; app.kubernetes.io/instance is its default tracking label
ARGOCD_TRACKING_LABELS = ("app.kubernetes.io/instance", "argocd.argoproj.io/instance")
# Flux's kustomize-controller and helm-controller label what they apply (and reconcile it back, as self-heal does)
FLUX_TRACKING_LABELS = ("kustomize.toolkit.fluxcd.io/name", "kustomize.toolkit.fluxcd.io/namespace",
                        "helm.toolkit.fluxcd.io/name", "helm.toolkit.fluxcd.io/namespace")

LiveRefused = Refused      # the name the command line used first


@dataclass
class LiveTarget:
    kubeconfig: str
    context: str
    namespace: str
    rollout: str
    container: str | None
    service_url: str | None


def check_inputs(args) -> LiveTarget:
    """Everything that can be checked without a request, before the first one."""
    if not (args.namespace and args.rollout):
        raise BadInput("live mode needs --namespace and --rollout (and --kubeconfig/--context as kubectl takes them)")
    plain_name(args.namespace, "--namespace", 63)        # both name the journal's entry (and files of the run)
    plain_name(args.rollout, "--rollout", 253)
    url = getattr(args, "service_url", None)
    kc, ctx = kube.resolve_kubeconfig(args.kubeconfig, args.context)
    if url:
        from ..traffic.load_target import LoadRefused, check_live_target
        try:
            check_live_target(url, api_server=server_of(kc, ctx))
        except LoadRefused as e:
            raise BadInput(f"--service-url: {e}") from None
    check_context(ctx, embedded=False, allow=args.allow_context)
    return LiveTarget(kc, ctx, args.namespace, args.rollout, getattr(args, "container", None), url)


def controller_image_version(api) -> str:
    """The live controller's version: its image tag."""
    apps = client.AppsV1Api(api)
    try:
        items = apps.list_deployment_for_all_namespaces(label_selector="app.kubernetes.io/name=argo-rollouts").items \
            or apps.list_deployment_for_all_namespaces().items
    except Exception:     # namespace-scoped RBAC cannot list cluster-wide: the version stays unknown
        return "unknown"
    for d in items:
        for c in d.spec.template.spec.containers:
            if "argo-rollouts" in (c.image or "") or "rollouts-controller" in (c.name or ""):
                tag = c.image.rsplit(":", 1)[-1] if ":" in c.image else "unknown"
                return config.normalise_version(tag) or tag
    return "unknown"


def argocd_tracking(ro: dict) -> str | None:
    """How a GitOps controller (Argo CD or Flux) tracks the Rollout, or None."""
    found = gitops_tracking(ro)
    return found[1] if found else None


def gitops_tracking(ro: dict) -> tuple[str, str] | None:
    """(the GitOps controller, how it tracks the Rollout) or None: Argo CD's tracking annotation or labels, Flux's
    kustomize or helm controller labels."""
    md = ro.get("metadata") or {}
    ann, labels = md.get("annotations") or {}, md.get("labels") or {}
    if not isinstance(ann, dict) or not isinstance(labels, dict):
        return None
    for k in ARGOCD_TRACKING_ANNOTATIONS:
        if k in ann:
            return "Argo CD", f"annotation {k}={ann[k]}"
    for k in ARGOCD_TRACKING_LABELS:
        if k in labels:
            return "Argo CD", f"label {k}={labels[k]}"
    for k in FLUX_TRACKING_LABELS:
        if k in labels:
            return "Flux", f"label {k}={labels[k]}"
    return None


def check_shape(ro: dict, container: str | None) -> str:
    """Refuse a Rollout the drill cannot handle; returns the application container's name."""
    where = f"rollout {ro['metadata']['namespace']}/{ro['metadata']['name']}"
    spec = ro.get("spec") if isinstance(ro.get("spec"), dict) else {}
    if spec.get("workloadRef"):
        raise Refused(f"{where} uses workloadRef: the drill rolls back spec.template, which this Rollout does not "
                      f"have")
    strategy = spec.get("strategy")
    canary = strategy.get("canary") if isinstance(strategy, dict) else None
    if not isinstance(canary, dict) or not canary.get("trafficRouting"):
        raise Refused(f"{where} is not a canary with traffic routing")
    router_of(ro)                      # a router whose weights the drills read
    steps = canary.get("steps")
    if isinstance(steps, list) and not all(isinstance(s, dict) and len(s) == 1 for s in steps):
        bad = next(i for i, s in enumerate(steps) if not (isinstance(s, dict) and len(s) == 1))
        raise Refused(f"{where}: canary step {bad} is not an object with one field ({steps[bad]!r})"[:300])
    if not isinstance(steps, list) or not any("setWeight" in s for s in steps if isinstance(s, dict)):
        raise Refused(f"{where} has no canary setWeight steps ({'steps: null' if 'steps' in canary else 'no steps'}"
                      f"{'' if not isinstance(steps, list) else ': ' + steps_text(steps)}): the backward search has "
                      f"nothing to pick, there is nothing for this drill to prove or cut")
    try:
        selector_string(spec.get("selector"))
        return app_container_name(spec.get("template"), container, ro["metadata"]["name"])
    except RolloutShapeError as e:
        raise Refused(f"{where}: {e}") from None


def preflight(api, target: LiveTarget, sync_paused: bool) -> dict:
    """Read-only checks; Refused (exit 2) when the drill would be unsafe or inconclusive anyway."""
    namespace, name = target.namespace, target.rollout
    check_namespace(api, namespace)
    ro_api = Rollouts(api, namespace)
    try:
        ro = ro_api.get(name)
    except k8s.ApiException as e:
        if e.status == 404:
            raise Refused(f"rollout {namespace}/{name} does not exist") from None
        raise kube.unreachable(e, api, f"reading rollout {namespace}/{name}") from None
    lease = ((ro["metadata"].get("annotations") or {}).get(LEASE_ANNOTATION))
    if lease:
        raise Refused(f"rollout {namespace}/{name} is held by another drill ({LEASE_ANNOTATION}: "
                      f"{describe_lease(lease)})")
    tracked = gitops_tracking(ro)
    if tracked and not sync_paused:
        how = "pause its sync" if tracked[0] == "Argo CD" else "suspend its reconciliation (flux suspend)"
        raise Refused(f"rollout {namespace}/{name} looks managed by {tracked[0]} ({tracked[1]}; its reconciliation "
                      f"would revert the drill): {how} and pass --sync-paused")
    app = check_shape(ro, target.container)
    st = ro.get("status") or {}
    if st.get("abort"):
        raise Refused(f"rollout {namespace}/{name} is aborted")
    if not healthy()(ro):
        raise Refused(f"rollout {namespace}/{name} is not Healthy (phase {st.get('phase')})")
    window = (ro["spec"].get("rollbackWindow") or {}).get("revisions")
    if not window:
        raise Refused(f"rollout {namespace}/{name} has no rollbackWindow: a rollback would walk the steps")
    try:
        target_rs = ro_api.revision_replicaset(ro)
    except ValueError as e:
        raise Refused(f"rollout {namespace}/{name}: the rollback target ReplicaSet is pruned ({e})") from None
    rss = ro_api.owned_replicasets(ro)
    stable = next((r for r in rss if (r.metadata.labels or {}).get(HASH_LABEL) == st.get("stableRS")), None)
    between = [r for r in rss if stable and target_rs.metadata.creation_timestamp < r.metadata.creation_timestamp
               < stable.metadata.creation_timestamp]
    if stable is None or target_rs.metadata.creation_timestamp >= stable.metadata.creation_timestamp \
            or len(between) >= window:
        raise Refused(f"rollout {namespace}/{name}: the rollback target is outside rollbackWindow "
                      f"({len(between)} ReplicaSets between it and stable, window {window})")
    if (target_rs.spec.replicas or 0) != 0 or (target_rs.status.replicas or 0) != 0:
        raise Refused(f"rollout {namespace}/{name}: the rollback target ReplicaSet "
                      f"{(target_rs.metadata.labels or {}).get(HASH_LABEL)} still has pods (not scaled to 0)")
    target_template, stable_template = _rs_template(target_rs), _rs_template(stable)
    if app not in container_images(target_template):
        raise Refused(f"rollout {namespace}/{name}: the rollback target's pod template has no container {app!r}")
    return {"rollout": ro, "target": target_rs, "stable": stable, "app": app, "target_template": target_template,
            "stable_template": stable_template}


def _rs_template(rs) -> dict:
    template = client.ApiClient().sanitize_for_serialization(rs.spec.template)
    template.get("metadata", {}).get("labels", {}).pop(HASH_LABEL, None)
    return template


def rollback_template(ro: dict, target_template: dict, app: str) -> dict:
    """The GitOps-style rollback: the spec's own template with only the application container's image reverted to
    the target revision's (a Git revert of the image tag); nothing else of the target revision is written."""
    return reverted_template(ro["spec"]["template"], app, container_images(target_template)[app])


def other_differences(pre: dict) -> list[str]:
    """What the rollback target revision differs in from the current one besides the application container's image
    (both ReplicaSets' templates, defaulted alike by the API server), container by container."""
    return template_differences(pre["stable_template"], pre["target_template"], pre["app"])


def check_other_differences(where: str, app: str, others: list[str], allow: bool, via: str) -> None:
    """Refused when the rollback target revision differs in more than the application container's image, unless
    --allow-other-changes (the drill then writes only that image; undo cannot, it writes the whole template)."""
    if not others:
        return
    said = "; ".join(others)
    if via == "undo":
        raise Refused(f"rollout {where}: the rollback target revision differs from the current one in more than "
                      f"container {app}'s image ({said}); --rollback-via undo writes the target revision's whole "
                      f"template and would change them: use --rollback-via gitops (with --allow-other-changes)")
    if not allow:
        raise Refused(f"rollout {where}: the rollback target revision differs from the current one in more than "
                      f"container {app}'s image ({said}); the drill reverts only {app}'s image and would roll back to "
                      f"a template no revision ran: nothing was sent. Pass --allow-other-changes to drill it anyway "
                      f"(those differences are then left as they are now)")


def live_controller(spec: str | None) -> str | None:
    """In live mode --controller names the live controller's version (one release tag) instead of its image tag."""
    if spec is None:
        return None
    v = config.normalise_version(spec) if "," not in spec else None
    if v is None:
        raise BadInput(f"--controller {spec!r}: in live mode give the one version the live controller runs "
                       f"(e.g. v1.8.2); without it the version is its image tag")
    return v


def router_of(ro: dict, strict: bool = True) -> str:
    """The router of a live Rollout, by its trafficRouting key as the controller picks it (its rows carry it);
    ``strict``: one whose weights the drills cannot read is refused, else named by its key (a read-only watch)."""
    canary = ((ro.get("spec") or {}).get("strategy") or {}).get("canary") or {}
    known = routers.of_canary(canary if isinstance(canary, dict) else {})
    if known is None and not strict:
        tr = canary.get("trafficRouting") if isinstance(canary, dict) else None
        return next(iter(sorted(tr)), "none") if isinstance(tr, dict) and tr else "none"
    if known is None:
        tr = canary.get("trafficRouting") if isinstance(canary, dict) else None
        raise Refused(f"rollout {ro['metadata'].get('namespace')}/{ro['metadata'].get('name')}: its trafficRouting "
                      f"({', '.join(sorted(tr)) if isinstance(tr, dict) else 'none'}) is none the drills read "
                      f"weights from ({', '.join(routers.NAMES)})")
    return known.name


def run_live_b(args, duration: float, log=None) -> int:
    """Lane B live: the next deploy of the named Rollout, watched read-only (the gate: allowlist, opt-in label)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    target = check_inputs(args)
    api = None
    try:                # one deadline for the whole preflight (the credentials included), retries inside it
        with kube.deadline(kube.read_timeout(), "live preflight"):
            api = kube.new_client(target.kubeconfig, target.context)
            check_namespace(api, target.namespace)
            router = router_of(Rollouts(api, target.namespace).get(target.rollout), strict=False)
            version = args.controller or controller_image_version(api)
    except k8s.ApiException as e:
        if e.status == 404:
            raise Refused(f"rollout {target.namespace}/{target.rollout} does not exist") from None
        raise kube.unreachable(e, api, "live preflight") from None
    except (BadInput, Interrupted):
        raise
    except Exception as e:   # a failure of the read-only preflight: nothing was mutated
        raise kube.unreachable(e, api, "live preflight") from None
    if args.dry_run:
        print(f"dry-run: would watch {target.namespace}/{target.rollout} read-only for up to {duration:.0f}s; "
              f"nothing is sent")
        return 0
    run_id = new_run_id()
    run_dir = config.reports_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(run_dir, run_id, target=target.context, controller_version=version,
                    kubernetes_version=server_version(api), router=router)
    ctx = LaneContext(api=api, namespace=target.namespace, evidence_dir=run_dir / "live", ledger=ledger,
                      version=version, variant="live", log=log, router=router)
    with SignalGuard() as guard:
        try:
            LiveLaneB(ctx, target.rollout, duration).first_deploy()
        except Interrupted as e:
            guard.quiet()
            ledger.record("b", "interrupted", "watch completed", "completed", str(e), INCONCLUSIVE,
                          reason=f"watch {e}", key="completed")
    return exit_code(ledger.rows)


def server_version(api) -> str | None:
    """The live API server's Kubernetes version, for the rows (None when it does not say: the drill goes on, a
    lease already taken is never left behind over a version string)."""
    try:
        return client.VersionApi(api).get_code().git_version
    except Exception:   # noqa: BLE001 -- any failure only means the version is not known
        return None


def run_live(args, log=None) -> int:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    target = check_inputs(args)
    api = None
    try:                # one deadline for the whole preflight (the credentials included), retries inside it
        with kube.deadline(kube.read_timeout(), "live preflight"):
            api = kube.new_client(target.kubeconfig, target.context)
            pre = preflight(api, target, args.sync_paused)
            version = args.controller or controller_image_version(api)
    except (BadInput, Interrupted):
        raise
    except Exception as e:   # a failure of the read-only preflight: nothing was mutated
        raise kube.unreachable(e, api, "live preflight") from None
    ro, app = pre["rollout"], pre["app"]
    router = router_of(ro)             # before anything is written: a router whose weights the drills cannot read
    steps = ro["spec"]["strategy"]["canary"]["steps"]
    cut = cut_final_full_weight(steps)
    template_v1 = rollback_template(ro, pre["target_template"], app)
    image_v1 = container_images(template_v1)[app]
    image_v2 = container_images(ro["spec"]["template"])[app]
    others = other_differences(pre)
    allow_others = bool(getattr(args, "allow_other_changes", False))
    revived = pre["target"].metadata.labels.get(HASH_LABEL)
    run_id = new_run_id()
    run_dir = config.reports_dir() / run_id
    left = ("left as they are now (--allow-other-changes): the controller makes a new ReplicaSet instead of "
            "reviving it, so a rollback the controller does not take as inside rollbackWindow is inconclusive"
            if allow_others else "refused without --allow-other-changes")
    plan = [f"annotate {target.namespace}/{target.rollout} {LEASE_ANNOTATION} (run {run_id})",
            f"BEFORE: roll back the pod template to ReplicaSet {revived} "
            f"(container {app}: {image_v2} -> {image_v1}; other containers unchanged)" if not others else
            f"BEFORE: roll back container {app}'s image {image_v2} -> {image_v1}, every other container as it is "
            f"now; the rollback target revision (ReplicaSet {revived}) also differs in: {'; '.join(others)}: {left}",
            f"cut the steps [{steps_text(steps)}] -> [{steps_text(cut)}]",
            f"redeploy container {app} at {image_v2}, wait for the rollback target to be scaled to 0",
            "AFTER: roll back again and observe",
            f"EXIT: redeploy container {app} at {image_v2}, roll back once more, abort while the revived "
            f"ReplicaSet is partly available, then promote --full",
            f"only should the controller leave a change unobserved or a promote not acted on (upstream #4694): "
            f"annotate {RESYNC_ANNOTATION} and remove it again, a few times at most (restore removes one left)",
            f"restore: the pod template and steps [{steps_text(steps)}] exactly as they are now"]
    if args.dry_run:
        for p in plan:
            print(f"dry-run: would {p}")
    check_other_differences(f"{target.namespace}/{target.rollout}", app, others, allow_others, args.rollback_via)
    if args.dry_run:
        return 0
    if others:
        log(f"live drill: the rollback target revision also differs in: {'; '.join(others)}; only container {app}'s "
            f"image is reverted, those are left as they are now (--allow-other-changes)")
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(run_dir / "journal.json", kubeconfig=target.kubeconfig, context=target.context, run_id=run_id)
    journal.before_spec_change(ro)
    try:        # the lease, taken only while nobody holds it (another drill may have passed its preflight too)
        take_lease(api, target.namespace, target.rollout, lease_value(
            run_id, journal.path, journal.original_digest(f"{target.namespace}/{target.rollout}")))
    except Refused:
        shutil.rmtree(run_dir, ignore_errors=True)      # nothing was changed: no journal to keep
        raise
    except Exception as e:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise kube.unreachable(e, api, "taking the lease") from None
    ledger = Ledger(run_dir, run_id, target=target.context, controller_version=version,
                    kubernetes_version=server_version(api), router=router)
    spec = RolloutSpec(steps=steps, replicas=ro["spec"].get("replicas", 1), name=target.rollout, router=router,
                       availability_control=False, rollback_via=args.rollback_via, container=app,
                       image_v1=image_v1, image_v2=image_v2)
    drill = DrillRollout(api, target.namespace, spec, run_dir / "live", journal=journal, log=log,
                         controller_version=version)
    # with other differences left as they are, the template sent matches no ReplicaSet: the controller makes a new one
    drill.adopt(revived=None if others else revived, stable=ro["status"]["stableRS"])
    rc = 0
    load = None
    with SignalGuard() as guard:
        restored = "not run"
        try:
            if target.service_url:
                load = PhasedLoad(None, target.namespace, target.rollout, run_dir / "load", lane="a",
                                  url=target.service_url)
            ctx = LaneContext(api=api, namespace=target.namespace, evidence_dir=run_dir / "live", ledger=ledger,
                              version=version, variant="live", log=log)
            # stops the drill when the API stops answering or someone else changes the Rollout meanwhile
            with Watchdog(guard, [api_answers(api), no_other_writer(api, target.namespace, target.rollout, journal,
                                                                    ro["spec"])]):
                LiveLaneA(ctx, drill, steps, cut, template_v1, load, template_before=ro["spec"]["template"],
                          other_differences=others).run()
        except Interrupted as e:
            log(f"live drill {e}; restoring")
            _record_stop(ledger, log, "interrupted", str(e), f"drill {e}")
            rc = 3
        except Exception as e:  # any failure: record it, restore, report
            log(f"live drill failed: {type(e).__name__}: {e}; restoring")
            _record_stop(ledger, log, "error", f"{type(e).__name__}: {e}",
                         "the drill stopped before its evidence was complete")
            rc = 3
        finally:
            restored = _restore(drill, load, journal, api, guard, log)
    code = exit_code(ledger.rows)
    if restored == "abandoned":
        return 1 if code == 1 else 3
    if restored != "done":
        return 1
    return 1 if 1 in (rc, code) else max(rc, code)


def _record_stop(ledger: Ledger, log, step: str, observed: str, reason: str) -> None:
    """The row of a drill that stopped; a ledger that cannot be written (a full disk) keeps it in memory, so the
    exit code still says inconclusive, and the restore goes on."""
    try:
        ledger.record("a", step, "drill completed", "completed", observed, INCONCLUSIVE, reason=reason,
                      key="completed")
    except OSError as e:
        log(f"live drill: the ledger {ledger.path} could not record it ({e}); the run is inconclusive")


def _restore(drill, load, journal: Journal, api, guard: SignalGuard, log) -> str:
    """Stop what the drill started and restore the Rollout: done | abandoned | refused | failed.  A signal
    during it abandons it; later signals are only noted."""
    try:
        if load:
            load.close()
        drill.cleanup()
        return "done" if restore_with_guard(journal, api, log=log, guard=guard) else "abandoned"
    except Interrupted:
        guard.quiet()
        journal.set_state("abandoned")
        log(f"restore abandoned; left to restore: {journal.describe()}. The lease stays on the Rollout until it is "
            f"done: drills restore --journal {journal.path}")
        return "abandoned"
    except BadInput as e:
        guard.quiet()
        log(f"restore refused: {e}")
        return "refused"
    except Exception as e:
        guard.quiet()
        log(f"restore failed: {kube.describe(e, kube.server_of(api), 'restore')}; finish it with: "
            f"drills restore --journal {journal.path}")
        return "failed"
    finally:
        guard.quiet()


__all__ = ["run_live", "preflight", "check_inputs", "LiveRefused"]
