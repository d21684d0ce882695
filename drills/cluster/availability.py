"""Availability control: hold chosen pods un-Ready and release them one at a time.

Every pod of the embedded cluster starts un-Ready; kwok makes it Ready once it carries the release
annotation (see stages.py).  The releaser, a process of the cluster, annotates pods:
- a pod no hold matches: after the default delay (seconds since the releaser first saw it);
- a pod a hold matches: one pod per hold period, oldest first; a hold with no period releases nothing
  until the drill releases pods itself.
Holds are data in a ConfigMap (``drills-system/drills-availability``), so they outlive the drill process.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from ..kube import k8s
from ..kube.k8s import client

from ..kube.api import conflict_retry, new_client
from ..core.wait import until
from ..kube.watching import ListWatch
from .stages import RELEASE_ANNOTATION
from .startup import polling_client

SYSTEM_NAMESPACE = "drills-system"
CONFIGMAP = "drills-availability"


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


@dataclass
class Hold:
    id: str
    namespace: str
    selector: dict
    period: float | None  # seconds between releases; None = released only by the drill
    batch: bool = False   # release every pending matching pod together, once per period

    def matches(self, namespace: str, labels: dict) -> bool:
        return namespace == self.namespace and _labels_match(self.selector, labels)


class Availability:
    """The drill's side: write holds, release pods, set the default delay."""

    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)

    # the ConfigMap ----------------------------------------------------------------------------
    def _read(self) -> tuple[dict, str | None]:
        try:
            cm = self.core.read_namespaced_config_map(CONFIGMAP, SYSTEM_NAMESPACE)
        except k8s.ApiException as e:
            if e.status == 404:
                return {"default_delay": 1.0, "holds": []}, None
            raise
        return json.loads((cm.data or {}).get("config.json") or "{}") or {"holds": []}, cm.metadata.resource_version

    def _write(self, data: dict, rv: str | None) -> None:
        body = {"metadata": {"name": CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
                "data": {"config.json": json.dumps(data, sort_keys=True)}}
        if rv is None:
            self.core.create_namespaced_config_map(SYSTEM_NAMESPACE, body)
        else:
            body["metadata"]["resourceVersion"] = rv
            self.core.replace_namespaced_config_map(CONFIGMAP, SYSTEM_NAMESPACE, body)

    def _update(self, fn) -> dict:
        @conflict_retry(10)
        def once() -> dict:
            data, rv = self._read()
            data.setdefault("holds", [])
            fn(data)
            self._write(data, rv)
            return data
        return once()

    def config(self) -> dict:
        return self._read()[0]

    def set_default_delay(self, seconds: float) -> None:
        self._update(lambda d: d.__setitem__("default_delay", float(seconds)))

    def hold(self, namespace: str, selector: dict, period: float | None, batch: bool = False) -> str:
        hid = uuid.uuid4().hex[:8]
        self._update(lambda d: d["holds"].append(
            {"id": hid, "namespace": namespace, "selector": dict(selector), "period": period, "batch": batch}))
        return hid

    def unhold(self, hold_id: str) -> None:
        self._update(lambda d: d.__setitem__("holds", [h for h in d["holds"] if h["id"] != hold_id]))

    def clear(self, namespace: str | None = None) -> None:
        self._update(lambda d: d.__setitem__(
            "holds", [h for h in d["holds"] if namespace is not None and h["namespace"] != namespace]))

    def release_pod(self, namespace: str, name: str) -> None:
        self.core.patch_namespaced_pod(name, namespace,
                                       {"metadata": {"annotations": {RELEASE_ANNOTATION: _now_iso()}}})


# --- the releaser process -------------------------------------------------------------------------
class Releaser:
    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)
        self.lock = threading.Lock()
        self.pending: dict[tuple[str, str], dict] = {}   # (ns, name) -> {"labels", "seen", "created"}
        self.conf: dict = {"default_delay": 1.0, "holds": []}
        self.last_release: dict[str, float] = {}
        self.stop = threading.Event()
        self.wake = threading.Event()       # a pod or the holds changed (or a stop): decide again now
        self.loops: list[ListWatch] = []

    def _watch_pods(self):
        def on_list(items, rv, relisted):
            with self.lock:
                now = time.monotonic()
                current = set()
                for p in items:
                    self._note(p, now)
                    current.add((p["metadata"]["namespace"], p["metadata"]["name"]))
                for k in list(self.pending):
                    if k not in current:
                        del self.pending[k]
            self.wake.set()

        def on_event(etype, p):
            with self.lock:
                if etype == "DELETED":
                    self.pending.pop((p["metadata"]["namespace"], p["metadata"]["name"]), None)
                else:
                    self._note(p, time.monotonic())
            self.wake.set()
        self._loop("pod", ListWatch(self.core.list_pod_for_all_namespaces, timeout_seconds=300), on_list, on_event)

    def _note(self, p: dict, now: float):
        md = p["metadata"]
        key = (md["namespace"], md["name"])
        if RELEASE_ANNOTATION in (md.get("annotations") or {}) or md.get("deletionTimestamp") is not None:
            self.pending.pop(key, None)
            return
        if key not in self.pending:
            self.pending[key] = {"labels": dict(md.get("labels") or {}), "seen": now,
                                 "created": md.get("creationTimestamp")}

    def _watch_config(self):
        def take(obj):
            data = json.loads(((obj or {}).get("data") or {}).get("config.json") or "{}")
            with self.lock:
                self.conf = {"default_delay": float(data.get("default_delay", 1.0)), "holds": data.get("holds", [])}
            self.wake.set()

        def on_list(items, rv, relisted):
            if items:
                take(items[0])

        def on_event(etype, obj):
            if etype != "DELETED":
                take(obj)
        self._loop("config", ListWatch(self.core.list_namespaced_config_map, SYSTEM_NAMESPACE,
                                       field_selector=f"metadata.name={CONFIGMAP}", timeout_seconds=300),
                   on_list, on_event)

    def _loop(self, what: str, lw: ListWatch, on_list, on_event):
        self.loops.append(lw)
        while not self.stop.is_set():
            try:
                lw.run(on_list, on_event)
            except Exception as e:      # a refused or failing watch: say it, list again shortly
                print(f"releaser: {what} watch restarted: {e}", file=sys.stderr, flush=True)
                lw.resource_version = None
                self.stop.wait(0.2)

    def _decide(self) -> tuple[list[tuple[str, str]], float | None]:
        """The pods to release now, and when the next pending one falls due (monotonic; None: none will until a
        pod or the holds change)."""
        now = time.monotonic()
        due: list[float] = []
        holds = [Hold(h["id"], h["namespace"], h.get("selector") or {}, h.get("period"), bool(h.get("batch")))
                 for h in self.conf["holds"]]
        to_release = []
        by_hold: dict[str, list] = {}
        for key, info in self.pending.items():
            hold = next((h for h in holds if h.matches(key[0], info["labels"])), None)
            if hold is None:
                if now - info["seen"] >= self.conf["default_delay"]:
                    to_release.append(key)
                else:
                    due.append(info["seen"] + self.conf["default_delay"])
            else:
                by_hold.setdefault(hold.id, []).append((info["seen"], key))
        for h in holds:
            queue = sorted(by_hold.get(h.id, []))
            if not queue or h.period is None:
                continue
            start = max(self.last_release.get(h.id, 0.0), queue[0][0])
            if now - start >= h.period:
                to_release.extend([k for _, k in queue] if h.batch else [queue[0][1]])
                self.last_release[h.id] = now
            else:
                due.append(start + h.period)
        return to_release, min(due, default=None)

    def run(self):
        for target in (self._watch_pods, self._watch_config):
            threading.Thread(target=target, daemon=True).start()
        while not self.stop.is_set():
            self.wake.clear()
            decided = time.monotonic()
            with self.lock:
                keys, due = self._decide()
            for ns, name in keys:
                try:
                    self.core.patch_namespaced_pod(name, ns,
                                                   {"metadata": {"annotations": {RELEASE_ANNOTATION: _now_iso()}}})
                    print(f"{_now_iso()} released {ns}/{name}", flush=True)
                except k8s.ApiException as e:
                    if e.status != 404:
                        print(f"releaser: release {ns}/{name} failed: {e.status}", file=sys.stderr, flush=True)
                with self.lock:
                    self.pending.pop((ns, name), None)
            if not keys and not self.stop.is_set():     # asleep until the next pod falls due, or a pod or the
                # holds change (an idle cluster's releaser costs no CPU); a minute at most, and a stop wakes it (one
                # set between the loop's check and the clear above is seen here)
                self.wake.wait(60.0 if due is None else min(60.0, max(0.0, due - time.monotonic())))
            # twenty decisions a second at most: pod events come in bursts
            self.stop.wait(max(0.0, decided + 0.05 - time.monotonic()))


def _wait_for_cluster(kubeconfig: str, timeout: float = 120) -> None:
    """Until the kubeconfig is written and the apiserver lists pods: the releaser starts with the cluster."""
    def answers() -> bool:
        api = polling_client(kubeconfig)
        if api is None:
            return False
        try:
            client.CoreV1Api(api).list_namespaced_pod(SYSTEM_NAMESPACE, limit=1, _request_timeout=2)
            return True
        except Exception:
            return False
    until("the cluster's apiserver to list pods", answers, timeout=timeout, interval=0.1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="drills-releaser")
    ap.add_argument("--kubeconfig", required=True)
    args = ap.parse_args(argv)
    _wait_for_cluster(args.kubeconfig)
    api = new_client(args.kubeconfig, agent="drills-releaser/0.1")
    r = Releaser(api)

    def stop():
        r.stop.set()
        r.wake.set()
        for lw in r.loops:
            lw.stop()
    # the handler only starts a thread: an Event set inside the handler could wait on the lock of the Event the
    # main thread was waiting on when the signal came (a lock it holds itself)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stop, daemon=True).start())
    r.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
