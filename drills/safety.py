"""Safety: which targets a drill may touch, a journal of inverse actions, and restore that always runs.

- The embedded cluster is always allowed; a live context only when allowlisted in the config file
  (``allowed_contexts:`` in ~/.config/drills/config.yaml, or $DRILLS_CONFIG) or with --allow-context.
- The namespace must carry the opt-in label ``drills.dev/allow=true``.
- Every mutation is journalled with its inverse before it is sent (a JSON file, so
  ``drills restore --journal FILE`` can finish a restore later).
- Restore returns each touched Rollout to the pod template, steps, replicas and abort/pause state it had
  before the drill, removes the drill's holds, and waits until the Rollout is Healthy at the ReplicaSet
  that was stable before the drill.
- SIGINT/SIGTERM interrupt the drill; the first one leads to restore, a second one during restore
  stops it and prints what is left.
"""
from __future__ import annotations

import copy
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import config

NAMESPACE_LABEL_VALUE = "true"


class RefusedTarget(Exception):
    """The target is not allowed: exit 2, nothing mutated."""


class Interrupted(BaseException):
    """A drill was interrupted by a signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


# --- allowlist ----------------------------------------------------------------------------------------
def allowed_contexts(config_file: Path | None = None) -> set[str]:
    path = Path(config_file or config.user_config_file())
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return set()
    except yaml.YAMLError as e:
        raise RefusedTarget(f"{path}: not valid YAML: {e}")
    return set(data.get("allowed_contexts") or [])


def check_context(context: str | None, embedded: bool, allow: list[str] | None = None,
                  config_file: Path | None = None) -> None:
    if embedded:
        return
    ok = allowed_contexts(config_file) | set(allow or [])
    if not context or context not in ok:
        raise RefusedTarget(f"context {context!r} is not allowlisted: add it to allowed_contexts in "
                            f"{config_file or config.user_config_file()} or pass --allow-context {context}")


def check_namespace(api: client.ApiClient, namespace: str) -> None:
    try:
        ns = client.CoreV1Api(api).read_namespace(namespace)
    except ApiException as e:
        if e.status == 404:
            raise RefusedTarget(f"namespace {namespace!r} does not exist")
        raise
    if (ns.metadata.labels or {}).get(config.NAMESPACE_OPT_IN_LABEL) != NAMESPACE_LABEL_VALUE:
        raise RefusedTarget(f"namespace {namespace!r} lacks the opt-in label "
                            f"{config.NAMESPACE_OPT_IN_LABEL}={NAMESPACE_LABEL_VALUE}")


# --- the journal ----------------------------------------------------------------------------------------
class Journal:
    """Inverse actions, written to disk before each mutation is sent."""

    def __init__(self, path: Path, kubeconfig: str | None = None, context: str | None = None):
        self.path = Path(path)
        self.data = {"kubeconfig": kubeconfig, "context": context, "rollouts": {}, "created": [], "holds": [],
                     "restored": False}
        self.lock = threading.Lock()
        if self.path.exists():
            self.data.update(json.loads(self.path.read_text()))
        else:
            self._save()

    @classmethod
    def load(cls, path: Path) -> "Journal":
        if not Path(path).exists():
            raise FileNotFoundError(f"journal {path} does not exist")
        return cls(path)

    def _save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        os.replace(tmp, self.path)

    def _key(self, ns, name):
        return f"{ns}/{name}"

    def before_spec_change(self, ro: dict):
        self._remember(ro)

    def before_status_change(self, ro: dict):
        self._remember(ro)

    def _remember(self, ro: dict):
        key = self._key(ro["metadata"]["namespace"], ro["metadata"]["name"])
        with self.lock:
            if key in self.data["rollouts"]:
                return
            st = ro.get("status") or {}
            self.data["rollouts"][key] = {
                "template": copy.deepcopy(ro["spec"]["template"]),
                "steps": copy.deepcopy(((ro["spec"].get("strategy") or {}).get("canary") or {}).get("steps")),
                "replicas": ro["spec"].get("replicas"), "paused": ro["spec"].get("paused", False),
                "abort": st.get("abort", False), "phase": st.get("phase"), "stableRS": st.get("stableRS"),
            }
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
        return not self.data.get("restored") and bool(self.data["rollouts"] or self.data["holds"])

    def describe(self) -> str:
        parts = [f"{k}: image {v['template']['spec']['containers'][0].get('image')}, steps "
                 f"{json.dumps(v['steps'])}, replicas {v['replicas']}, abort {v['abort']}"
                 for k, v in self.data["rollouts"].items()]
        parts += [f"hold {h['id']} in {h['namespace']}" for h in self.data["holds"]]
        return "; ".join(parts) or "nothing"

    # --- restore ----------------------------------------------------------------------------------
    def restore(self, api: client.ApiClient, timeout: float = 180, log=None) -> None:
        from .cluster.availability import Availability
        from .rollout import GROUP, PLURAL, VERSION, Rollouts, healthy, healthy_at
        log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        co = client.CustomObjectsApi(api)
        av = Availability(api)
        for h in list(self.data["holds"]):
            try:
                av.unhold(h["id"])
            except ApiException:
                pass
        self.data["holds"] = []
        self._save()
        deadline = time.monotonic() + timeout
        for key, orig in self.data["rollouts"].items():
            ns, name = key.split("/", 1)
            try:
                ro = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            except ApiException as e:
                if e.status == 404:
                    continue
                raise
            log(f"restore: {key} -> image {orig['template']['spec']['containers'][0].get('image')}, "
                f"steps {json.dumps(orig['steps'])}")
            patch = {"spec": {"template": orig["template"], "replicas": orig["replicas"],
                              "paused": orig["paused"]}}
            if orig["steps"] is not None:
                patch["spec"]["strategy"] = {"canary": {"steps": orig["steps"]}}
            co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, patch)
            ro = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            st = ro.get("status") or {}
            if st.get("abort") and not orig["abort"]:
                co.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                         {"status": {"abort": False}})
            if orig.get("phase") == "Healthy":
                rl = Rollouts(api, ns)
                rl.wait(name, healthy_at(orig["stableRS"]) if orig.get("stableRS") else healthy(),
                        timeout=max(5.0, deadline - time.monotonic()), progress=lambda m: log(f"restore: {m}"))
                log(f"restore: {key} Healthy")
        self.data["restored"] = True
        self._save()


# --- signals --------------------------------------------------------------------------------------
class SignalGuard:
    """Turns SIGINT/SIGTERM into ``Interrupted`` in the main thread; during restore a second signal
    raises again so restore can be abandoned (and what is left printed)."""

    def __init__(self):
        self.count = 0
        self.received: int | None = None
        self._old = {}

    def _handler(self, signum, frame):
        self.count += 1
        self.received = signum
        raise Interrupted(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def restore_with_guard(journal: Journal, api, log=None, timeout: float = 180) -> bool:
    """Run restore; a signal during restore abandons it and prints what is left.  True when restored."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        journal.restore(api, timeout=timeout, log=log)
        return True
    except Interrupted:
        log(f"restore abandoned; left to restore: {journal.describe()}. "
            f"Finish it with: drills restore --journal {journal.path}")
        return False
