"""Applying rendered manifests to a cluster, as a GitOps sync does (server-side apply)."""
from __future__ import annotations

from ..kube.k8s import client, dynamic

from ..core import config
from ..core import fastyaml

FIELD_MANAGER = "drills"


def docs(text: str) -> list[dict]:
    return [d for d in fastyaml.safe_load_all(text) if d]


def apply(api: client.ApiClient, namespace: str, text: str, journal=None, dry_run: bool = False) -> list[dict]:
    """Server-side apply every object of ``text`` into ``namespace``; returns the applied objects."""
    dyn = dynamic.DynamicClient(api)
    out = []
    for doc in docs(text):
        doc.setdefault("metadata", {})["namespace"] = namespace
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        if dry_run:
            print(f"dry-run: would apply {doc['kind']} {namespace}/{doc['metadata']['name']}", flush=True)
            continue
        if journal and doc["kind"] == "Rollout":
            try:
                cur = client.CustomObjectsApi(api).get_namespaced_custom_object(
                    config.ARGO_GROUP, config.ARGO_VERSION, namespace, "rollouts", doc["metadata"]["name"])
                journal.before_spec_change(cur)
            except client.rest.ApiException:
                journal.created("Rollout", namespace, doc["metadata"]["name"])
        obj = dyn.server_side_apply(res, body=doc, name=doc["metadata"]["name"], namespace=namespace,
                                    field_manager=FIELD_MANAGER, force_conflicts=True)
        out.append(obj.to_dict())
    return out
