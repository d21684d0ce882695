"""Actions on a Rollout, each the same request the kubectl-argo-rollouts plugin sends, and named waits.

Requests (plugin parity, DESIGN.md §2):
- promote:        status merge patch (pauseConditions / currentStepIndex), spec merge patch
                  ``{"spec":{"paused":false}}`` when spec.paused; fallback to the main resource on NotFound
- promote --full: status merge patch ``{"status":{"promoteFull":true}}`` (only when currentPodHash != stableRS)
- abort / retry:  status merge patch ``{"status":{"abort":true|false}}``
- undo:           JSON patch replace /spec/template with the revision's ReplicaSet template minus the hash label
- restart:        merge patch ``{"spec":{"restartAt": RFC3339}}``
- set image:      GET, change the container image, full Update
- scale:          the scale subresource (as ``kubectl scale``)
Status writes carry the resourceVersion they were computed from (a precondition), so a retried write
never advances a Rollout twice.  The GitOps-style rollback writes the previous pod template into the
spec, as a Git revert synced by Argo CD does.
"""
from __future__ import annotations

import copy
import json
import time
from datetime import datetime, timezone
from typing import Any, Callable

from . import k8s
from .k8s import client
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from ..core import config
from .api import conflict_retry
from .api import transient as _transient
from ..core.podtemplate import RolloutShapeError, selector_string
from ..core.signals import held
from ..core.wait import WaitTimeout
from .watching import ListWatch
from .rollout_states import (  # noqa: F401 (the predicates are this module's API too)
    Predicate, _observed, aborted, at_step, degraded, healthy, healthy_at, paused, promote_taken, summarize_rollout
)

GROUP, VERSION, PLURAL = config.ARGO_GROUP, config.ARGO_VERSION, "rollouts"
HASH_LABEL = config.HASH_LABEL
REVISION_ANNOTATION = config.REVISION_ANNOTATION
api_retry = retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(6),
                  wait=wait_exponential(multiplier=0.1, max=2), reraise=True)


OBSERVE_WITHIN = 20.0         # seconds a controller gets to observe a new spec generation before it is announced again
RESYNC_ANNOTATION = "drills.dev/resync"
PROMOTE_ACT_WITHIN = 20.0     # seconds a controller gets to take a plain promote before it is sent again
PROMOTE_ANNOUNCE_AT_MOST = 3  # times a promote stored but not acted on is announced again, each after act_within
#                               (the timeout comes first for most callers: 60 s at 20 s each leaves room for one)


class Rollouts:
    """Acting on Rollouts of one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str, journal=None, dry_run: bool = False, log=None):
        self.api = api
        self.ns = namespace
        self.co = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.journal = journal
        self.dry_run = dry_run
        self.log = log or (lambda m: None)
        self.requests: list[dict] = []     # every mutating request sent (or, dry-run, that would be)

    # --- low level ------------------------------------------------------------------------------
    @api_retry
    def get(self, name: str) -> dict:
        return self.co.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def _send(self, what: str, name: str, body, fn: Callable[[], Any]):
        self.requests.append({"action": what, "rollout": name, "body": body})
        if self.dry_run:
            print(f"dry-run: would {what} rollout {self.ns}/{name}: {json.dumps(body, default=str)}", flush=True)
            return None
        self.log(f"{what} {self.ns}/{name}")
        out = api_retry(fn)()
        if self.journal is not None and isinstance(out, dict):
            self.journal.after_spec_change(out)
        return out

    def _patch_status(self, name: str, what: str, status_patch: dict, rv: str | None) -> dict | None:
        body = {"status": status_patch}
        if rv:
            body["metadata"] = {"resourceVersion": rv}

        def do():
            try:
                return self.co.patch_namespaced_custom_object_status(GROUP, VERSION, self.ns, PLURAL, name, body)
            except k8s.ApiException as e:
                if e.status == 404:   # no status subresource: the plugin's fallback to the main resource
                    return self.co.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, body)
                raise
        return self._send(what, name, body, do)

    def _merge_patch(self, name: str, what: str, body: dict):
        return self._send(what, name, body, lambda: self.co.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, body))

    # --- create / spec changes --------------------------------------------------------------------
    def create(self, manifest: dict) -> dict:
        name = manifest["metadata"]["name"]
        if self.journal:
            self.journal.created("Rollout", self.ns, name)
        return self._send("create", name, manifest, lambda: self.co.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, manifest))

    def set_image(self, name: str, image: str, container: str = "*") -> dict:
        """`kubectl argo rollouts set image NAME CONTAINER=IMAGE`: GET, change, Update, recomputed on a conflict
        (``*`` = every container, as the plugin; drills always name the application container)."""
        return conflict_retry()(self._set_image)(name, image, container)

    def _set_image(self, name: str, image: str, container: str) -> dict:
        ro = self.get(name)
        new = copy.deepcopy(ro)
        spec = new["spec"].get("template", {}).get("spec") or {}
        hit = False
        for key in ("initContainers", "containers", "ephemeralContainers"):
            for c in spec.get(key) or []:
                if container in ("*", c["name"]):
                    c["image"] = image
                    hit = True
        if not hit:
            raise RolloutShapeError(f"unable to find container named {container!r}")
        if self.journal:
            self.journal.before_spec_change(ro, intended=new)

        def update():
            try:
                return self.co.replace_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, new)
            except k8s.ApiException as e:
                # a retried Update whose first attempt was applied (its answer lost) conflicts on the
                # resourceVersion: it is done when the template is already the one this Update carried
                if e.status == 409:
                    cur = self.get(name)
                    if cur["spec"].get("template") == new["spec"].get("template"):
                        return cur
                raise
        return self._send("set image", name, {"image": image, "container": container}, update)

    def set_steps(self, name: str, steps: list[dict]) -> dict:
        """A values change that edits the canary steps (a merge patch replaces the list, as Helm does)."""
        ro = self.get(name)
        if self.journal:
            self.journal.before_spec_change(ro, intended=_with(ro, ("strategy", "canary", "steps"), steps))
        return self._merge_patch(name, "set steps", {"spec": {"strategy": {"canary": {"steps": steps}}}})

    def gitops_rollback(self, name: str, template: dict) -> dict:
        """Revert the pod template in the spec (a Git revert of the image tag, synced): the template is
        replaced as given, so nothing of the current one is merged into it."""
        ro = self.get(name)
        if self.journal:
            self.journal.before_spec_change(ro, intended=_with(ro, ("template",), template))
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        return self._send("gitops rollback", name, patch, lambda: self.co.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, patch, _content_type="application/json-patch+json"))

    def scale(self, name: str, replicas: int):
        ro = self.get(name)
        if self.journal:
            self.journal.before_spec_change(ro)
        body = {"spec": {"replicas": replicas}}
        return self._send("scale", name, body, lambda: self.co.patch_namespaced_custom_object_scale(
            GROUP, VERSION, self.ns, PLURAL, name, body))

    def restart(self, name: str, at: datetime | None = None):
        at = at or datetime.now(timezone.utc)
        body = {"spec": {"restartAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}}
        return self._merge_patch(name, "restart", body)

    def undo(self, name: str, to_revision: int = 0) -> dict | None:
        """`kubectl argo rollouts undo NAME [--to-revision N]`."""
        ro = self.get(name)
        rs = self.revision_replicaset(ro, to_revision)
        template = self.apps.api_client.sanitize_for_serialization(rs.spec.template)
        template.setdefault("metadata", {}).setdefault("labels", {}).pop(HASH_LABEL, None)
        cur = copy.deepcopy(ro["spec"]["template"])
        if _equal_ignore_hash(cur, template):
            self.log(f"skipped rollback (current template already matches revision {to_revision})")
            return None
        if self.journal:
            self.journal.before_spec_change(ro, intended=_with(ro, ("template",), template))
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        return self._send("undo", name, patch, lambda: self.co.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, patch, _content_type="application/json-patch+json"))

    def owned_replicasets(self, ro: dict) -> list:
        sel = selector_string(ro["spec"].get("selector"))
        rss = api_retry(self.apps.list_namespaced_replica_set)(self.ns, label_selector=sel).items
        uid = ro["metadata"]["uid"]
        return [rs for rs in rss if any(o.uid == uid and o.controller for o in (rs.metadata.owner_references or []))]

    def revision_replicaset(self, ro: dict, to_revision: int = 0):
        rss = []
        for rs in self.owned_replicasets(ro):
            try:
                rss.append((int((rs.metadata.annotations or {}).get(REVISION_ANNOTATION)), rs))
            except (TypeError, ValueError):
                continue
        rss.sort(key=lambda x: x[0])
        if to_revision:
            for v, rs in rss:
                if v == to_revision:
                    return rs
            raise ValueError(f"unable to find specified revision {to_revision} in history")
        if len(rss) < 2:
            raise ValueError(f"no revision found for rollout {ro['metadata']['name']!r}")
        return rss[-2][1]

    # --- status actions ---------------------------------------------------------------------------
    def _fresh(self, action, name: str, *args, attempts: int = 5, **kw):
        """Status writes carry the resourceVersion they were computed from; on a conflict (the controller
        wrote in between, so ours was not applied) the write is recomputed from a fresh read."""
        return conflict_retry(attempts)(action)(name, *args, **kw)

    def promote(self, name: str, full: bool = False) -> dict | None:
        if full:
            return self._fresh(self._promote, name, full=True)
        st = self.get(name).get("status") or {}
        base = (st.get("currentStepIndex"), bool(st.get("pauseConditions")))

        def once(n):
            # a retry after a conflict (or a lost answer) never advances twice: when the step index moved or
            # the pause it meant to clear is gone, the promote (ours or the controller's) took effect
            cur = self.get(n).get("status") or {}
            if (cur.get("currentStepIndex"), bool(cur.get("pauseConditions"))) != base and \
                    (cur.get("currentStepIndex") != base[0] or (base[1] and not cur.get("pauseConditions"))):
                return None
            return self._promote(n)
        return self._fresh(once, name)

    def abort(self, name: str):
        return self._fresh(self._abort, name)

    def retry(self, name: str):
        return self._fresh(self._retry, name)

    def _promote(self, name: str, full: bool = False, unless: Predicate | None = None) -> dict | None:
        ro = self.get(name)
        if unless is not None and unless(ro):
            return None
        st = ro.get("status") or {}
        rv = ro["metadata"]["resourceVersion"]
        if self.journal:
            self.journal.before_status_change(ro)
        if full:
            if st.get("currentPodHash") != st.get("stableRS"):
                return self._patch_status(name, "promote --full", {"promoteFull": True}, rv)
            return None
        steps = ((ro["spec"].get("strategy") or {}).get("canary") or {}).get("steps") or []
        status_patch = None
        if st.get("pauseConditions"):
            status_patch = {"pauseConditions": None}
        elif (ro["spec"].get("strategy") or {}).get("canary") is not None and steps:
            index = st.get("currentStepIndex") or 0
            if index < len(steps):
                index += 1
            status_patch = {"pauseConditions": None, "currentStepIndex": index}
        out = None
        if status_patch is not None:
            out = self._patch_status(name, "promote", status_patch, rv)
        if ro["spec"].get("paused"):
            out = self._merge_patch(name, "promote (unpause)", {"spec": {"paused": False}})
        return out

    def _abort(self, name: str):
        ro = self.get(name)
        if self.journal:
            self.journal.before_status_change(ro)
        return self._patch_status(name, "abort", {"abort": True}, ro["metadata"]["resourceVersion"])

    def _retry(self, name: str):
        ro = self.get(name)
        if self.journal:
            self.journal.before_status_change(ro)
        return self._patch_status(name, "retry", {"abort": False}, ro["metadata"]["resourceVersion"])

    # --- a plain promote the controller is seen to take ---------------------------------------------
    # Controllers before v1.10.0 put the object of their own last status write back into their informer
    # cache (writeBackToInformer, rollout/controller.go).  A promote that lands between such a write and
    # its write-back is overwritten in the cache by the older, paused object, and no later watch event
    # corrects it: the controller keeps reconciling the pause it already left in etcd (upstream #4694;
    # v1.10.0 replaced the write-back with a resourceVersion tracker, #4786).  So a drill checks that the
    # controller took the promote and, when it did not, promotes again as the plugin would from the state
    # now stored -- computed from a fresh read, under its resourceVersion, and only while that state is
    # still the untaken pause, so a promote never advances twice.  A promote stored but still not acted on
    # (the one sent again, or a first one a second promote must not follow: the next step is another pause) is
    # announced again (``resync``: two watch events carrying the stored object), said each time, at most
    # PROMOTE_ANNOUNCE_AT_MOST times within the timeout.  Seen on v1.8.2 resumed with a reconcile in flight: the
    # watch events of both promotes re-queued the Rollout while that reconcile ran, its write-back then put the
    # copy from before them in the cache ("persisted to informer"), and the reconcile they queued read that copy
    # ("stepIndex: 1/2", no patch); nothing else re-queued it.
    def promote_and_wait(self, name: str, timeout: float = 60, act_within: float = PROMOTE_ACT_WITHIN,
                         on_send: Callable[[str, dict | None], None] | None = None,
                         progress: Callable[[str], None] | None = None) -> dict | None:
        """A plain promote of the current pause; returns the response of the first request once the
        controller has taken it (``promote_taken``).  ``on_send(label, response)`` sees every request sent
        ("promote", then any "promote (sent again)"), e.g. to mark it on a timeline."""
        ro = self.get(name)
        index = (ro.get("status") or {}).get("currentStepIndex")
        taken = promote_taken(index)
        res = self.promote(name)
        if on_send:
            on_send("promote", res)
        deadline = time.monotonic() + timeout
        announced = 0
        while True:
            try:
                self.wait(name, taken, max(1.0, min(act_within, deadline - time.monotonic())), progress=progress)
                return res
            except WaitTimeout as e:
                if time.monotonic() >= deadline:
                    if not announced:
                        raise
                    raise WaitTimeout(f"{e}; the promote stored was announced again {announced} time(s)",
                                      e.last) from None
            cur = self.get(name)
            st = cur.get("status") or {}
            if taken(cur):
                continue        # taken meanwhile: wait for it
            steps = ((cur["spec"].get("strategy") or {}).get("canary") or {}).get("steps") or []
            moved = st.get("currentStepIndex") != index          # by the promote sent again
            before_pause = not moved and not st.get("pauseConditions") and index is not None \
                and index + 1 < len(steps) and "pause" in steps[index + 1]
            if (moved or before_pause) and announced < PROMOTE_ANNOUNCE_AT_MOST:
                announced += 1
                self.log(f"the controller has not acted on the promote of the pause at step {index} within "
                         f"{act_within:.0f}s (stored: {summarize_rollout(cur)}, controllerPause="
                         f"{st.get('controllerPause')}); announcing it again ({announced} of at most "
                         f"{PROMOTE_ANNOUNCE_AT_MOST}: resync annotation set and removed; upstream #4694, a stale "
                         f"write-back into its cache)")
                self.resync(name, cur["metadata"].get("generation"))
                continue
            if moved:
                continue        # announced as often as it is: wait for it until the timeout
            if before_pause:
                raise WaitTimeout(f"the controller did not take the promote of the pause at step {index} within "
                                  f"{act_within:.0f}s ({summarize_rollout(cur)}), announced again {announced} "
                                  f"time(s); a second promote would also pass the pause at step {index + 1}, so "
                                  f"none was sent", cur)
            self.log(f"the controller did not take the promote of the pause at step {index} within "
                     f"{act_within:.0f}s (stored: {summarize_rollout(cur)}, pauseConditions="
                     f"{st.get('pauseConditions')}, controllerPause={st.get('controllerPause')}); "
                     f"promoting again as the plugin would")
            again = self._fresh(self._promote, name, unless=taken)
            if on_send and again is not None:
                on_send("promote (sent again)", again)

    # --- waits ------------------------------------------------------------------------------------
    # The same write-back (upstream #4694, #4073) loses a spec change: a status patch of the controller lands,
    # the drill's Update follows, and the write-back of the patch's answer replaces the newer object in the
    # controller's cache; it reconciles the older generation and nothing re-queues the Rollout until its
    # resync (minutes).  A spec generation the controller has not observed after OBSERVE_WITHIN seconds is
    # announced again by an annotation set and removed (two watch events carrying the stored spec): said,
    # and at most once per generation.  A controller with the fix never waits that long.
    def resync(self, name: str, generation) -> None:
        """Make the controller's cache see the stored Rollout again: a resync annotation set, then removed (a signal
        waits for the pair; one left behind all the same is removed with the drill's lease on restore)."""
        with held():
            for value in (str(generation), None):
                body = {"metadata": {"annotations": {RESYNC_ANNOTATION: value}}}
                self.requests.append({"action": "resync", "rollout": name, "body": body})
                if self.dry_run:
                    return
                api_retry(lambda: self.co.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name,
                                                                         body))()

    def wait(self, name: str, pred: Predicate, timeout: float = 120, progress: Callable[[str], None] | None = None,
             observe_within: float | None = OBSERVE_WITHIN) -> dict:
        """Wait on a watch of the Rollout until ``pred`` holds (drills.kube.watching: resumes and relists by itself);
        WaitTimeout naming the wait and the Rollout as last seen.  A generation the controller leaves unobserved
        for ``observe_within`` seconds is announced again (``resync``; None: never)."""
        last: list = [None]
        note = [time.monotonic() + 15]
        unobserved: dict = {}          # generation -> when first seen unobserved (None once announced again)

        def announce(obj) -> None:
            if observe_within is None or obj is None or _observed(obj):
                return
            gen = obj["metadata"].get("generation")
            since = unobserved.setdefault(gen, time.monotonic())
            if since is not None and time.monotonic() - since >= observe_within:
                unobserved[gen] = None
                self.log(f"the controller has not observed generation {gen} of {self.ns}/{name} after "
                         f"{observe_within:.0f}s ({summarize_rollout(obj)}); announcing it again (resync "
                         f"annotation set and removed: upstream #4073, a stale write-back into its cache)")
                self.resync(name, gen)

        def seen(obj):
            last[0] = obj
            if pred(obj):
                return True
            announce(obj)
            if progress and time.monotonic() > note[0]:
                progress(f"waiting for {pred.name}: {summarize_rollout(obj)}")
                note[0] = time.monotonic() + 15
            return False

        lw = ListWatch(self.co.list_namespaced_custom_object, GROUP, VERSION, self.ns, PLURAL,
                       field_selector=f"metadata.name={name}", timeout_seconds=30)
        end = time.monotonic() + timeout
        while True:         # the watch in slices, so a controller that writes nothing is still noticed
            tick = end if observe_within is None else min(end, time.monotonic() + max(1.0, observe_within / 2))
            if lw.run(lambda items, rv, relisted: seen(items[0] if items else None),
                      lambda etype, obj: seen(None if etype == "DELETED" else obj), deadline=tick):
                return last[0]
            if time.monotonic() >= end:
                break
            announce(last[0])
        raise WaitTimeout(f"timed out after {timeout:g}s waiting for {pred.name} on rollout "
                          f"{self.ns}/{name}; last seen: {summarize_rollout(last[0])}", last[0])

    def wait_replicasets(self, name: str, what: str, fn: Callable[[list[dict]], bool], timeout: float = 120
                         ) -> list[dict]:
        """Wait until ``fn(the Rollout's ReplicaSets, as dicts)`` holds, on a watch of its ReplicaSets."""
        ro = self.get(name)
        uid = ro["metadata"]["uid"]
        rss: dict[str, dict] = {}

        def owned() -> list[dict]:
            return [r for r in rss.values() if any(o.get("uid") == uid and o.get("controller")
                                                   for o in r["metadata"].get("ownerReferences") or [])]

        def on_list(items, rv, relisted):
            rss.clear()
            rss.update({i["metadata"]["name"]: i for i in items})
            return fn(owned())

        def on_event(etype, obj):
            if etype == "DELETED":
                rss.pop(obj["metadata"]["name"], None)
            else:
                rss[obj["metadata"]["name"]] = obj
            return fn(owned())

        lw = ListWatch(self.apps.list_namespaced_replica_set, self.ns,
                       label_selector=selector_string(ro["spec"].get("selector")), timeout_seconds=30)
        if lw.run(on_list, on_event, deadline=time.monotonic() + timeout):
            return owned()
        desc = ", ".join(f"{((r['metadata'].get('labels') or {}).get(HASH_LABEL))}: spec "
                         f"{(r.get('spec') or {}).get('replicas')} avail "
                         f"{(r.get('status') or {}).get('availableReplicas') or 0}" for r in owned())
        raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what} on rollout {self.ns}/{name}; "
                          f"last seen ReplicaSets: {desc or 'none'}")

    def wait_scaled_to_zero(self, name: str, pod_hash: str, timeout: float = 120) -> None:
        def done(rss):
            for rs in rss:
                if (rs["metadata"].get("labels") or {}).get(HASH_LABEL) == pod_hash:
                    return ((rs.get("spec") or {}).get("replicas") or 0) == 0 and \
                        ((rs.get("status") or {}).get("replicas") or 0) == 0
            return False
        self.wait_replicasets(name, f"ReplicaSet {pod_hash} scaled to 0", done, timeout)


def _with(ro: dict, path: tuple, value) -> dict:
    """A copy of the Rollout with spec.<path> set: what a spec write is meant to leave (the journal's intent)."""
    out = copy.deepcopy(ro)
    node = out.setdefault("spec", {})
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = copy.deepcopy(value)
    return out


def _equal_ignore_hash(a: dict, b: dict) -> bool:
    a = copy.deepcopy(a)
    b = copy.deepcopy(b)
    for t in (a, b):
        t.setdefault("metadata", {}).setdefault("labels", {}).pop(HASH_LABEL, None)
        t["metadata"].pop("creationTimestamp", None)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

