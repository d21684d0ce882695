"""Safety: which targets a drill may touch, a lease on the Rollout, a journal of inverse actions, and a
restore that always runs and never overwrites someone else's change.

- The embedded cluster is always allowed; a live context only when allowlisted in the config file
  (``allowed_contexts: [ctx, ...]`` in ~/.config/drills/config.yaml, or $DRILLS_CONFIG) or with
  --allow-context.  Anything but a list of context names there is refused (the allowlist fails closed).
- The namespace must carry the opt-in label ``drills.dev/allow=true``.
- A lease annotation (``drills.dev/lease``) says which drill holds the Rollout and which journal restores it;
  it stays on the Rollout until a restore finished, so nothing else drills a Rollout that still owes one.
- Every mutation is journalled before it is sent (the Rollout as it was), and after it (what the drill wrote),
  in a JSON file (0600, with a digest of its content: drills.core.journal_file), so ``drills restore --journal FILE``
  can finish a restore later; a journal whose content is not what its digest (and the lease's record of the
  original) says is refused before anything is sent.  ``--release-lease`` is the way out (drills.drill.lease).
- Restore puts back exactly what the drill changed: the pod template and the canary steps as they were
  (a JSON patch that replaces them, guarded by the resourceVersion it was computed from), spec.paused when
  the drill changed it, and the abort state.  It never touches what the drill did not change (replicas stay
  whatever an autoscaler or a person set).  It refuses (exit 2, naming what moved) when the Rollout's template
  or steps are neither the original nor something the drill wrote: someone else changed it since.
  A journal already restored is not replayed.
- SIGINT/SIGTERM interrupt the drill and lead to restore; a second signal abandons the restore (the lease and
  the journal stay, and what is left is printed); further signals are only noted.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from ..kube import k8s
from ..kube.k8s import client

from ..core import config, inputs
from ..kube import api as kube
from ..cluster.namespaces import OPT_IN_VALUE as NAMESPACE_LABEL_VALUE
from ..core.errors import BadInput, Refused
from ..core.journal_file import (
    DIGEST_KEY, canonical, digest_of, drill_running, edited_original, read_json, unsigned, write_private
)
from ..core.names import is_plain_name
from ..core.podtemplate import app_container_name
from ..core.procs import identity
from ..kube.rollout import GROUP, PLURAL, RESYNC_ANNOTATION, VERSION, Rollouts, healthy, healthy_at
from ..core.signals import Interrupted, SignalGuard

LEASE_ANNOTATION = "drills.dev/lease"
JOURNAL_VERSION = 3
WAY_OUT = "README, Live mode, 'A way out'"

RefusedTarget = Refused      # the name the rest of the package used first


class JournalError(BadInput):
    """A journal that cannot be read or used: exit 2."""


# --- allowlist ----------------------------------------------------------------------------------------
def allowed_contexts(config_file: Path | None = None) -> set[str]:
    """The allowlisted contexts of the config file; Refused when the file is not what it must be."""
    path = Path(config_file or config.user_config_file())
    try:
        data = inputs.load_yaml_file(path, what="config file")
    except FileNotFoundError:
        return set()
    except OSError as e:
        raise Refused(f"{path}: cannot read it: {e}") from None
    except BadInput as e:                  # not UTF-8, not YAML, over the size, depth or alias budget
        raise Refused(str(e)) from None
    if data is None:
        return set()
    if not isinstance(data, dict):
        raise Refused(f"{path}: must be a mapping with allowed_contexts: [context, ...]")
    items = data.get("allowed_contexts")
    if items is None:
        return set()
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        shown = repr(items)[:80]
        raise Refused(f"{path}: allowed_contexts must be a list of context names, e.g. "
                      f"'allowed_contexts: [stage-eu-1]'; found {shown}: nothing is allowlisted until it is fixed")
    return set(items)


def check_context(context: str | None, embedded: bool, allow: list[str] | None = None,
                  config_file: Path | None = None) -> None:
    if embedded:
        return
    ok = allowed_contexts(config_file) | {a for a in (allow or []) if a}
    if not context or context not in ok:
        raise Refused(f"context {context!r} is not allowlisted: add it to allowed_contexts in "
                      f"{config_file or config.user_config_file()} or pass --allow-context {context}")


def check_namespace(api: client.ApiClient, namespace: str) -> None:
    try:
        ns = client.CoreV1Api(api).read_namespace(namespace)
    except k8s.ApiException as e:
        if e.status == 404:
            raise Refused(f"namespace {namespace!r} does not exist") from None
        raise kube.unreachable(e, api, f"reading namespace {namespace!r}") from None
    except Exception as e:
        raise kube.unreachable(e, api, f"reading namespace {namespace!r}") from None
    if (ns.metadata.labels or {}).get(config.NAMESPACE_OPT_IN_LABEL) != NAMESPACE_LABEL_VALUE:
        raise Refused(f"namespace {namespace!r} lacks the opt-in label "
                      f"{config.NAMESPACE_OPT_IN_LABEL}={NAMESPACE_LABEL_VALUE}")


# --- the lease ---------------------------------------------------------------------------------------------
def lease_value(run_id: str, journal_path: Path, original: str | None = None) -> str:
    """The lease: the drill's run and journal, and (``original``) the digest of the journal's record of the Rollout
    as it was, so a restore can tell that record from an edited one."""
    value = {"run": run_id, "journal": str(journal_path), "pid": os.getpid()}
    if original:
        value["original"] = original
    return json.dumps(value, separators=(",", ":"))


def parse_lease(value: str | None) -> dict:
    if not value:
        return {}
    try:
        data = json.loads(value)
        return data if isinstance(data, dict) else {"run": str(value)}
    except ValueError:
        return {"run": str(value)}


def describe_lease(value: str) -> str:
    lease = parse_lease(value)
    text = f"run {lease.get('run')}"
    if lease.get("journal"):
        text += (f"; if that drill is gone, finish it with: drills restore --journal {lease['journal']} (when that "
                 f"refuses: drills restore --release-lease --journal {lease['journal']}, {WAY_OUT})")
    return text


def take_lease(api, namespace: str, name: str, value: str, attempts: int = 5) -> dict:
    """Set the lease only while nobody holds it: the write carries the resourceVersion of the read that found the
    Rollout free, so of two drills that both passed their preflight only one gets it.  Refused for the other."""
    co = client.CustomObjectsApi(api)
    for _ in range(attempts):
        ro = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        held = (ro["metadata"].get("annotations") or {}).get(LEASE_ANNOTATION)
        if held:
            raise Refused(f"rollout {namespace}/{name} is held by another drill ({LEASE_ANNOTATION}: "
                          f"{describe_lease(held)})")
        body = {"metadata": {"resourceVersion": ro["metadata"]["resourceVersion"],
                             "annotations": {LEASE_ANNOTATION: value}}}
        try:
            return co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body)
        except k8s.ApiException as e:
            if e.status != 409:         # 409: it changed since the read; look again
                raise
    raise Refused(f"rollout {namespace}/{name} kept changing while the drill took its lease; nothing was changed, "
                  f"try again")


# --- the journal ----------------------------------------------------------------------------------------
def _spec_fields(ro: dict) -> dict:
    spec = ro.get("spec") or {}
    canary = (spec.get("strategy") or {}).get("canary") or {}
    return {"template": copy.deepcopy(spec.get("template")), "steps": copy.deepcopy(canary.get("steps")),
            "steps_present": "steps" in canary, "paused": bool(spec.get("paused", False))}


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


class Journal:
    """Inverse actions, written to disk before each mutation is sent, and what each mutation left."""

    def __init__(self, path: Path, kubeconfig: str | None = None, context: str | None = None,
                 run_id: str | None = None, create: bool = True, verify: bool = True):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.data = {"version": JOURNAL_VERSION, "run_id": run_id, "pid": os.getpid(), "process": identity(os.getpid()),
                     "kubeconfig": kubeconfig, "context": context, "state": "open", "rollouts": {}, "created": [],
                     "holds": [], "restored": False}
        self.signed = True          # False for a journal read unverified that is not what its digest says
        if self.path.exists():
            found, self.signed = self._read(self.path, verify)
            self.data.update(found)
            if "process" not in found:
                self.data.pop("process")
        elif create:
            self._save()

    @staticmethod
    def _read(path: Path, verify: bool = True) -> tuple[dict, bool]:
        """The journal's content, and whether it is what its digest says (JournalError when it must be and is not,
        or when it is not a journal)."""
        try:
            data = read_json(Path(path))
        except OSError as e:
            raise JournalError(f"journal {path}: cannot read it: {e}") from None
        except ValueError as e:
            raise JournalError(f"journal {path}: not valid JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("rollouts", {}), dict) \
                or not isinstance(data.get("holds", []), list):
            raise JournalError(f"journal {path}: not a drills journal (no 'rollouts' mapping)")
        found = data.get(DIGEST_KEY)
        signed = found == digest_of(data)             # before the entries are read (and upgraded) below
        for key, entry in (data.get("rollouts") or {}).items():
            ns, _, name = str(key).partition("/")
            if not (is_plain_name(ns, 63) and is_plain_name(name, 253)) or not isinstance(entry, dict):
                raise JournalError(f"journal {path}: rollout entry {str(key)[:120]!r} is not namespace/name (plain "
                                   f"names) with its state")
            if "original" not in entry:         # first journal layout: the entry is the original state
                data["rollouts"][key] = entry = {"original": entry, "written": []}
            orig, written = entry.get("original"), entry.setdefault("written", [])
            if not isinstance(orig, dict) or not isinstance(orig.get("template"), dict):
                raise JournalError(f"journal {path}: rollout {key} has no recorded pod template")
            if not isinstance(orig.get("steps"), (list, type(None))) or not isinstance(written, list) or \
                    not all(isinstance(w, dict) for w in written):
                raise JournalError(f"journal {path}: rollout {key}: its recorded steps or writes are not lists")
        for h in data.get("holds") or []:
            if not isinstance(h, dict) or not is_plain_name(h.get("id"), 253) or \
                    not is_plain_name(h.get("namespace"), 63):
                raise JournalError(f"journal {path}: a hold without id and namespace: {h!r}"[:300])
        if verify and not signed:
            raise JournalError(unsigned(path, found, WAY_OUT))
        if data.get("restored") and data.get("state", "open") == "open":
            data["state"] = "restored"
        return data, signed

    @classmethod
    def load(cls, path: Path, verify: bool = True) -> "Journal":
        """The journal at ``path``; with ``verify`` (what restore sends comes from it) only when its content is
        what its digest says."""
        if not Path(path).is_file():
            raise JournalError(f"journal {path} does not exist")
        return cls(path, create=False, verify=verify)

    def _save(self):
        write_private(self.path, self.data, sign=self.signed)      # an edited journal never gets a fresh digest

    def original_digest(self, key: str) -> str | None:
        """The digest of the journal's record of rollout ``key`` as it was (what the lease carries)."""
        entry = self.data["rollouts"].get(key)
        return "sha256:" + hashlib.sha256(canonical(entry["original"]).encode()).hexdigest() if entry else None

    @property
    def state(self) -> str:
        return self.data.get("state", "open")

    def set_state(self, state: str) -> None:
        with self.lock:
            self.data["state"] = state
            self.data["restored"] = state == "restored"
            self.data[f"{state}_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self._save()

    @staticmethod
    def _key(ns, name):
        return f"{ns}/{name}"

    # recording -----------------------------------------------------------------------------------------
    def before_spec_change(self, ro: dict, intended: dict | None = None):
        """The Rollout as it is before a spec write, and (``intended``) what the write is meant to leave: recorded
        before the write is sent, so a write whose answer never came is still known as the drill's own."""
        self._remember(ro)
        if intended is not None:
            self.after_spec_change(intended)

    def before_status_change(self, ro: dict):
        self._remember(ro)

    def _remember(self, ro: dict):
        key = self._key(ro["metadata"]["namespace"], ro["metadata"]["name"])
        with self.lock:
            if key in self.data["rollouts"]:
                return
            st = ro.get("status") or {}
            orig = _spec_fields(ro)
            orig.update({"replicas": (ro.get("spec") or {}).get("replicas"), "abort": st.get("abort", False),
                         "phase": st.get("phase"), "stableRS": st.get("stableRS")})
            self.data["rollouts"][key] = {"original": orig, "written": []}
            self._save()

    def after_spec_change(self, ro: dict | None):
        """What a spec mutation left on the Rollout (the response of the write)."""
        if not isinstance(ro, dict) or "spec" not in ro:
            return
        key = self._key(ro["metadata"]["namespace"], ro["metadata"]["name"])
        with self.lock:
            entry = self.data["rollouts"].get(key)
            if entry is None:
                return
            entry["written"].append(_spec_fields(ro))
            self._save()

    def created(self, kind: str, ns: str, name: str):
        with self.lock:
            self.data["created"].append({"kind": kind, "namespace": ns, "name": name})
            self._save()

    def held(self, ns: str, hold_id: str):
        with self.lock:
            self.data["holds"].append({"namespace": ns, "id": hold_id})
            self._save()

    @property
    def pending(self) -> bool:
        return self.state != "restored" and bool(self.data["rollouts"] or self.data["holds"])

    def describe(self) -> str:
        parts = []
        for k, v in self.data["rollouts"].items():
            o = v["original"]
            parts.append(f"{k}: image {_app_image(o['template'])}, steps {json.dumps(o.get('steps'))}, "
                         f"abort {o.get('abort', False)}")
        parts += [f"hold {h['id']} in {h['namespace']}" for h in self.data["holds"]]
        return "; ".join(parts) or "nothing"

    # restore -------------------------------------------------------------------------------------------
    def moved_on(self, key: str, ro: dict) -> list[str]:
        """What of the Rollout is neither as it was nor as the drill left it (someone else changed it)."""
        entry = self.data["rollouts"][key]
        now = _spec_fields(ro)
        known = [entry["original"], *entry["written"]]
        out = []
        if not any(_same(now["template"], k.get("template")) for k in known):
            out.append(f"spec.template (app image now {_app_image(now['template'])}; the drill never wrote that "
                       f"template)")
        if not any(_same(now["steps"], k.get("steps")) for k in known):
            out.append(f"spec.strategy.canary.steps (now {json.dumps(now['steps'])})")
        return out

    def restore(self, api: client.ApiClient, timeout: float = 180, log=None) -> None:
        """Restore what the drill changed; Refused when the Rollout moved on.  No-op when already restored."""
        from ..cluster.availability import Availability
        log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        if self.state == "restored":
            log(f"restore: journal {self.path} was already restored ({self.data.get('restored_at', 'earlier')}); "
                "nothing to do")
            return
        for h in list(self.data["holds"]):
            try:
                Availability(api).unhold(h["id"])
            except k8s.ApiException:
                pass
        with self.lock:
            self.data["holds"] = []
            unsaved = self._save_during_restore(log)
        deadline = time.monotonic() + timeout
        for key in list(self.data["rollouts"]):
            self._restore_one(api, key, deadline, log)
        try:
            self.set_state("restored")
        except OSError as e:
            if not unsaved:
                log(f"restore: journal {self.path} could not be updated ({e}); the Rollout is restored regardless")

    def _save_during_restore(self, log) -> bool:
        """The journal saved while a restore runs; a journal that cannot be written (a full disk) does not stop the
        restore: the target matters more than its record, and restoring again finds nothing left to do."""
        try:
            self._save()
            return False
        except OSError as e:
            log(f"restore: journal {self.path} could not be updated ({e}); restoring the Rollout regardless")
            return True

    def _restore_one(self, api, key: str, deadline: float, log) -> None:
        ns, name = key.split("/", 1)
        co = client.CustomObjectsApi(api)
        orig = self.data["rollouts"][key]["original"]
        for _attempt in range(5):
            try:
                ro = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            except k8s.ApiException as e:
                if e.status == 404:
                    log(f"restore: {key} no longer exists; nothing to restore there")
                    return
                raise
            self._check_lease_record(key, ro)
            moved = self.moved_on(key, ro)
            if moved:
                raise Refused(f"rollout {key} moved on since the drill: {'; '.join(moved)}. Restoring would "
                              f"overwrite that change; nothing was sent. Journal: {self.path}. To give the Rollout "
                              f"up without restoring it: drills restore --release-lease --journal {self.path} "
                              f"({WAY_OUT})")
            now = _spec_fields(ro)
            ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": ro["metadata"]["resourceVersion"]}]
            if not _same(now["template"], orig["template"]):
                ops.append({"op": "replace", "path": "/spec/template", "value": orig["template"]})
            if not _same(now["steps"], orig["steps"]) or now["steps_present"] != orig.get("steps_present", True):
                if orig.get("steps_present", orig["steps"] is not None):
                    ops.append({"op": "add", "path": "/spec/strategy/canary/steps", "value": orig["steps"]})
                elif now["steps_present"]:
                    ops.append({"op": "remove", "path": "/spec/strategy/canary/steps"})
            if now["paused"] != orig.get("paused", False) and any(
                    w.get("paused", False) != orig.get("paused", False) for w in self.data["rollouts"][key]["written"]):
                ops.append({"op": "add", "path": "/spec/paused", "value": orig.get("paused", False)})
            if len(ops) > 1:
                log(f"restore: {key} -> image {_app_image(orig['template'])}, steps {json.dumps(orig['steps'])}")
                try:
                    co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, ops,
                                                      _content_type="application/json-patch+json")
                except k8s.ApiException as e:
                    if e.status in (409, 422):     # the test op failed: it changed under us, look again
                        continue
                    raise
            break
        else:
            raise Refused(f"rollout {key} kept changing while restore ran; nothing more was sent. "
                          f"Journal: {self.path}")
        ro = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        if (ro.get("status") or {}).get("abort") and not orig.get("abort"):
            Rollouts(api, ns).retry(name)
        if orig.get("phase") == "Healthy":
            Rollouts(api, ns).wait(name, healthy_at(orig["stableRS"]) if orig.get("stableRS") else healthy(),
                                   timeout=max(5.0, deadline - time.monotonic()),
                                   progress=lambda m: log(f"restore: {m}"))
            log(f"restore: {key} Healthy")
        self._release_lease(co, ns, name, log)

    def _check_lease_record(self, key: str, ro: dict) -> None:
        """Refused when the drill's lease on the Rollout records another original than this journal holds."""
        lease = parse_lease((ro["metadata"].get("annotations") or {}).get(LEASE_ANNOTATION))
        said = lease.get("original")
        if lease.get("run") == self.data.get("run_id") and said not in (None, self.original_digest(key)):
            raise Refused(edited_original(self.path, key, WAY_OUT))

    def _release_lease(self, co, ns: str, name: str, log) -> None:
        ro = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        annotations = ro["metadata"].get("annotations") or {}
        if (value := annotations.get(LEASE_ANNOTATION)) and parse_lease(value).get("run") == self.data.get("run_id"):
            # with the drill's resync annotation, should a signal or a lost answer have left it there
            drop = {LEASE_ANNOTATION: None, **({RESYNC_ANNOTATION: None} if RESYNC_ANNOTATION in annotations else {})}
            co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"metadata": {"annotations": drop}})
            log(f"restore: {ns}/{name} lease released")


def _app_image(template: dict | None) -> str | None:
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    try:
        name = app_container_name(template)
    except BadInput:
        return ",".join(str(c.get("image")) for c in containers) or None
    return next((c.get("image") for c in containers if c.get("name") == name), None)


def restore_with_guard(journal: Journal, api, log=None, timeout: float = 180,
                       guard: SignalGuard | None = None) -> bool:
    """Run restore; a signal during it abandons the restore and prints what is left (the journal and the lease
    stay).  True when restored; Refused propagates (someone else changed the Rollout)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        journal.restore(api, timeout=timeout, log=log)
        return True
    except Interrupted:
        if guard is not None:
            guard.quiet()
        journal.set_state("abandoned")
        log(f"restore abandoned; left to restore: {journal.describe()}. The lease stays on the Rollout until "
            f"it is done: drills restore --journal {journal.path}")
        return False


def check_drill_gone(j: Journal) -> None:
    pid = drill_running(j.data) if j.state == "open" else None
    if pid is not None:
        raise Refused(f"the drill that wrote {j.path} is still running (pid {pid}); it restores on exit "
                      f"(signal it once with SIGINT)")


def restore_journal(path: Path, allow: list[str] | None = None, log=None) -> bool:
    """`drills restore --journal FILE`: check the journal, its target (allowlist, opt-in label) and that its
    drill is gone, then restore.  True when restored (or nothing was left to do); False when abandoned."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    j = Journal.load(Path(path))
    if j.state == "restored":
        print(f"journal {j.path} was already restored ({j.data.get('restored_at', 'earlier')}): nothing to do")
        return True
    check_drill_gone(j)
    kc, ctx = j.data.get("kubeconfig"), j.data.get("context")
    if not (kc and ctx and isinstance(kc, str) and isinstance(ctx, str)):
        raise JournalError(f"journal {j.path}: names no kubeconfig/context to restore on")
    check_context(ctx, embedded=False, allow=allow)
    try:        # the read-only preflight: one deadline; a signal here leaves the journal as it was, and says so
        with SignalGuard(), kube.deadline(kube.read_timeout(), "restore preflight"):
            api = kube.new_client(kc, ctx)
            for ns in sorted({k.split("/", 1)[0] for k in j.data["rollouts"]}):
                check_namespace(api, ns)
    except Interrupted as e:
        raise Interrupted(e.signum, f"{e} during the restore's preflight: nothing was sent and the journal {j.path} "
                                    f"is untouched (state {j.state}); finish it with: drills restore --journal "
                                    f"{j.path}") from None
    with SignalGuard() as guard:
        try:
            return restore_with_guard(j, api, log=log, guard=guard)
        except Interrupted:
            return False
        finally:
            guard.quiet()
