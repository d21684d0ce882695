"""Rollouts of live clusters, read-only (list and get only: nothing is written).

Contexts resolve as kubectl resolves them (``--kubeconfig``, else KUBECONFIG, else ~/.kube/config; the
current context, ``--context``, or every context with ``--all-contexts``), the Rollouts of every namespace
(``-A``, the default) or of one (``-n``), those a label selector matches (``-l``).  The controller version of a
cluster is the image tag of its argo-rollouts controller Deployment (found by the labels the upstream
manifests and Helm chart put on it, else by its image); a cluster without one is reported, not guessed.
``--controller`` overrides it (a digest-pinned image, a controller outside the cluster): every Rollout read is
predicted on the versions given, and the inventory says both.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from ..kube.k8s import client

from .. import __version__
from ..core import config
from ..kube import api as kube
from ..core.errors import BadInput
from ..kube.kubeconfig import contexts as kubeconfig_contexts
from . import autoscalers as scalers
from .model import ScanInputError, from_object

USER_AGENT = f"drills-scan/{__version__}"     # the scan's requests are told apart in the apiserver's audit log

_CONTROLLER_LABELS = ("app.kubernetes.io/name=argo-rollouts", "app.kubernetes.io/component=rollouts-controller")
_IMAGE_RE = re.compile(r"(^|/)argo-rollouts(@|:|$)")
_NOT_CONTROLLER = ("dashboard", "kubectl-argo-rollouts")


@dataclass
class ClusterInventory:
    context: str
    controller_version: str | None
    controller: str | None            # namespace/name of the Deployment and its image
    rollouts: int = 0
    exposed: int = 0
    error: str | None = None
    specs: list = field(default_factory=list)
    controller_unknown: str | None = None         # why the version is not known (None: known, or --controller)
    controller_given: list[str] | None = None     # --controller: the versions predicted on instead
    namespace: str | None = None                  # -n: the one namespace read (None: every namespace)
    selector: str | None = None                   # -l: the label selector
    autoscalers: list = field(default_factory=list)   # HPAs and ScaledObjects that target a Rollout

    def as_dict(self) -> dict:
        return {"context": self.context, "controller_version": self.controller_version,
                "controller": self.controller, "rollouts": self.rollouts, "exposed": self.exposed,
                "error": self.error, "controller_given": self.controller_given, "namespace": self.namespace,
                "selector": self.selector, "controller_unknown": self.controller_unknown}


def contexts(kubeconfig: str | None, context: str | None, all_contexts: bool) -> list[tuple[str, str]]:
    """(kubeconfig file, context) pairs to read, resolved as kubectl resolves them (drills.kube.api)."""
    if not all_contexts:
        return [kube.resolve_kubeconfig(kubeconfig, context)]
    kc, names = kubeconfig_contexts(kubeconfig)
    if not names:
        raise ScanInputError("kubeconfig has no contexts", kc)
    return [(kc, name) for name in names]


def _image_version(image: str) -> str | None:
    tag = image.rsplit("@", 1)[0]
    tag = tag.rsplit(":", 1)[1] if ":" in tag.rsplit("/", 1)[-1] else ""
    return config.normalise_version(tag) if tag else None


def controller_of(apps_api) -> tuple[str | None, str | None]:
    """(version, 'namespace/name image') of the argo-rollouts controller Deployment, or (None, None).  A Deployment
    the controller's labels find counts by its container named ``argo-rollouts`` too (an image mirrored under
    another repository name)."""
    candidates = []
    for sel in _CONTROLLER_LABELS:
        candidates += apps_api.list_deployment_for_all_namespaces(label_selector=sel).items
    labelled = bool(candidates)
    if not candidates:
        candidates = apps_api.list_deployment_for_all_namespaces().items
    for d in candidates:
        name = d.metadata.name or ""
        if any(x in name for x in _NOT_CONTROLLER):
            continue
        for c in d.spec.template.spec.containers or []:
            image = c.image or ""
            repo = image.rsplit("@", 1)[0].rsplit(":", 1)[0]
            if (_IMAGE_RE.search(repo) or (labelled and c.name == "argo-rollouts")) \
                    and not any(x in image for x in _NOT_CONTROLLER):
                return _image_version(image), f"{d.metadata.namespace}/{name} {image}"
    return None, None


def unknown_reason(version: str | None, where: str | None) -> str | None:
    """Why the cluster's controller version is not known (None when it is)."""
    if version:
        return None
    if where:
        return (f"the controller image ({where}) names no release tag (digest-pinned, or a tag such as 'latest')")
    return ("no argo-rollouts controller Deployment visible (a controller outside the cluster, an image mirrored "
            "under another name without the controller's labels, or RBAC that hides it)")


def read_cluster(kubeconfig: str, context: str, namespace: str | None = None, selector: str | None = None,
                 controllers: list[str] | None = None) -> ClusterInventory:
    """One cluster's inventory (list and get only); a cluster that cannot be read is an inventory with its
    error, so the other contexts are still read.  ``namespace``: only that namespace's Rollouts; ``selector``: a
    label selector; ``controllers``: the versions to predict on instead of the one the cluster shows (its
    Deployments need not be readable then)."""
    scope = dict(controller_given=controllers, namespace=namespace, selector=selector)
    try:
        kube.resolve_kubeconfig(kubeconfig, context)
        api = kube.new_client(kubeconfig, context, agent=USER_AGENT)
    except BadInput as e:
        return ClusterInventory(context, None, None, error=str(e), **scope)
    version = where = None
    try:
        version, where = controller_of(client.AppsV1Api(api))
    except Exception as e:
        if not controllers:                      # without --controller the version is what the scan needs
            return ClusterInventory(context, None, None, **scope,
                                    error=kube.describe(e, kube.server_of(api), "finding the rollouts controller"))
    try:
        co, sel = client.CustomObjectsApi(api), ({"label_selector": selector} if selector else {})
        gv = (config.ARGO_GROUP, config.ARGO_VERSION)
        items = (co.list_namespaced_custom_object(*gv, namespace, "rollouts", **sel)
                 if namespace else co.list_cluster_custom_object(*gv, "rollouts", **sel))
    except Exception as e:                       # refused, forbidden, TLS, a silent server: said in one line
        return ClusterInventory(context, None, None, **scope,
                                error=kube.describe(e, kube.server_of(api), "listing Rollouts"))
    inv = ClusterInventory(context, version, where, **scope)
    unknown = None if controllers else unknown_reason(version, where)
    inv.controller_unknown = unknown
    items = items.get("items") if isinstance(items, dict) else items
    items = [] if items is None else items
    if not isinstance(items, list):
        return ClusterInventory(context, version, where, **scope, error=f"listing Rollouts: the API server answered "
                                                                         f"items that are not a list "
                                                                         f"({type(items).__name__})")
    for i, obj in enumerate(items):
        if not isinstance(obj, dict):
            return ClusterInventory(context, version, where, **scope, error=f"listing Rollouts: item {i} is not an "
                                                                             f"object ({obj!r})"[:300])
        md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        ro = from_object(obj, f"cluster:{context}/{md.get('namespace')}/{md.get('name')}")
        ro.origin = {"cluster": context, "controller": where}
        if unknown:
            ro.origin["controller_unknown"] = unknown
        for v in controllers or [version or ""]:
            inv.specs.append(dataclasses.replace(ro, controller_version=v, origin=dict(ro.origin)))
    inv.rollouts = len(items)
    try:
        inv.autoscalers = read_autoscalers(co, context, namespace)
    except ScanInputError as e:                  # the Rollouts stand; the scan exits 2 naming the object
        inv.error = str(e)
    except Exception as e:
        inv.error = kube.describe(e, kube.server_of(api), "listing autoscalers")
    return inv


# (group, version, plural, kind) of the autoscalers read; a cluster without KEDA's CRD has no ScaledObjects
AUTOSCALER_APIS = (("autoscaling", "v2", "horizontalpodautoscalers", scalers.HPA),
                   ("keda.sh", "v1alpha1", "scaledobjects", scalers.KEDA))


def read_autoscalers(co, context: str, namespace: str | None) -> list:
    """The HPAs (autoscaling/v2) and KEDA ScaledObjects that target a Rollout, listed read-only through the scan's
    client (its timeouts) in every namespace or ``namespace``; the label selector is the Rollouts' only (an
    autoscaler does not carry its Rollout's labels).  A 404 for ScaledObjects is a cluster without KEDA: none."""
    out = []
    for group, version, plural, kind in AUTOSCALER_APIS:
        try:
            doc = (co.list_namespaced_custom_object(group, version, namespace, plural) if namespace
                   else co.list_cluster_custom_object(group, version, plural))
        except client.exceptions.ApiException as e:
            if e.status == 404 and kind == scalers.KEDA:
                continue
            raise
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise ScanInputError(f"listing {plural}: the API server answered items that are not a list")
        for obj in items:
            if not isinstance(obj, dict):
                raise ScanInputError(f"listing {plural}: an item is not an object ({obj!r})"[:300])
            obj = dict(obj, kind=obj.get("kind") or kind, apiVersion=obj.get("apiVersion") or f"{group}/{version}")
            md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            a = scalers.from_object(obj, f"cluster:{context}/{md.get('namespace')}/{md.get('name')}",
                                    file=f"cluster:{context}", origin={"cluster": context})
            if a is not None:
                out.append(a)
    return out
