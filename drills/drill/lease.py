"""`drills restore --release-lease --journal J`: the way out of a restore that refuses.

A restore refuses (exit 2, nothing sent) when the Rollout moved on since the drill, or when the journal is not what
its digest says; the lease then stays on the Rollout and every later drill is refused.  Releasing the lease gives
the Rollout up without restoring it: it checks the journal's target as a restore does (the allowlist, the
namespace's opt-in label, the drill that wrote the journal gone), removes the lease only where the lease names this
journal (its run, and its journal file or its record of the Rollout as it was), records who released it (in the
journal and as the annotation ``drills.dev/lease-released`` on the Rollout) and sends nothing else.  Nothing of the
journal's content is sent, so an edited journal can still release its own lease, and only its own.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from ..kube import k8s
from ..kube.k8s import client

from ..kube import api as kube
from ..cluster.usage import user
from ..core.errors import Refused
from ..kube.rollout import GROUP, PLURAL, VERSION
from .safety import (
    LEASE_ANNOTATION, Journal, JournalError, check_context, check_drill_gone, check_namespace, parse_lease
)

RELEASED_ANNOTATION = "drills.dev/lease-released"


def _same_file(a: str | None, b: Path) -> bool:
    try:
        return bool(a) and os.path.samefile(a, b)
    except (OSError, TypeError, ValueError):
        return False


def _patch_path(annotation: str) -> str:
    return "/metadata/annotations/" + annotation.replace("~", "~0").replace("/", "~1")


def release_lease(path: Path, allow: list[str] | None = None, log=None) -> bool:
    """Remove the lease this journal's drill left on each of its Rollouts; True when none is left."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    j = Journal.load(Path(path), verify=False)
    check_drill_gone(j)
    kc, ctx, run = j.data.get("kubeconfig"), j.data.get("context"), j.data.get("run_id")
    if not (kc and ctx and isinstance(kc, str) and isinstance(ctx, str)):
        raise JournalError(f"journal {j.path}: names no kubeconfig/context to release a lease on")
    if not run or not isinstance(run, str):
        raise JournalError(f"journal {j.path}: names no run, so no lease can be proven to be its own")
    check_context(ctx, embedded=False, allow=allow)
    api = kube.new_client(kc, ctx)
    keys = sorted(j.data["rollouts"])
    for ns in sorted({k.split("/", 1)[0] for k in keys}):
        check_namespace(api, ns)
    co = client.CustomObjectsApi(api)
    found = []
    for key in keys:
        ns, name = key.split("/", 1)
        try:
            ro = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except k8s.ApiException as e:
            if e.status == 404:
                log(f"release-lease: {key} no longer exists; no lease there")
                continue
            raise kube.unreachable(e, api, f"reading rollout {key}") from None
        except Exception as e:
            raise kube.unreachable(e, api, f"reading rollout {key}") from None
        value = (ro["metadata"].get("annotations") or {}).get(LEASE_ANNOTATION)
        if not value:
            log(f"release-lease: {key} carries no lease; nothing to release")
            continue
        lease = parse_lease(value)
        ours = lease.get("run") == run and (_same_file(lease.get("journal"), j.path) or (
            lease.get("original") and lease.get("original") == j.original_digest(key)))
        if not ours:
            raise Refused(f"the lease on rollout {key} is not this journal's ({LEASE_ANNOTATION}: {value[:200]}); "
                          f"nothing was released")
        found.append((key, ro, value))
    who = {"by": user(), "host": socket.gethostname(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "run": run, "journal": str(j.path)}
    for key, ro, value in found:
        ns, name = key.split("/", 1)
        ops = [{"op": "test", "path": _patch_path(LEASE_ANNOTATION), "value": value},
               {"op": "remove", "path": _patch_path(LEASE_ANNOTATION)},
               {"op": "add", "path": _patch_path(RELEASED_ANNOTATION), "value": json.dumps(who, sort_keys=True)}]
        try:
            co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, ops,
                                              _content_type="application/json-patch+json")
        except k8s.ApiException as e:
            if e.status in (409, 422):
                raise Refused(f"the lease on rollout {key} changed while it was being released; nothing was "
                              f"released there, try again") from None
            raise kube.unreachable(e, api, f"releasing the lease on rollout {key}") from None
        log(f"release-lease: {key} lease released by {who['by']} on {who['host']} (the Rollout itself was not "
            f"restored: it stays as it is now)")
    if found:
        j.data["lease_released"] = dict(who, rollouts=[k for k, _, _ in found])
        try:
            j.set_state("lease-released")
        except OSError as e:
            log(f"release-lease: journal {j.path} could not be updated ({e}); the lease is released regardless")
    return True


__all__ = ["RELEASED_ANNOTATION", "release_lease"]
