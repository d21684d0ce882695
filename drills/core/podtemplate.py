"""Pod templates and selectors of a Rollout: which container is the application, container images, a
template with one image changed, a label selector as list/watch calls take it."""
from __future__ import annotations

import copy

from .errors import BadInput

NAME_LABEL = "app.kubernetes.io/name"
# containers injected next to the application by meshes and agents: never the app
KNOWN_SIDECARS = ("istio-proxy", "istio-init", "linkerd-proxy", "linkerd-init", "envoy", "envoy-sidecar",
                  "vault-agent", "cloud-sql-proxy", "datadog-agent", "fluent-bit", "otel-collector")


class RolloutShapeError(BadInput):
    """A valid Rollout the drill cannot handle (no template, no containers, an unusable selector): exit 2."""


def app_container_name(template: dict | None, wanted: str | None = None, rollout_name: str | None = None) -> str:
    """The application container of a pod template: ``wanted`` when given (it must exist), the only container,
    else the one named like the Rollout or its ``app.kubernetes.io/name`` label, else the only one that is not a
    known sidecar.  RolloutShapeError when it cannot be told: the caller names it (``--container``)."""
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    names = [c.get("name") for c in containers]
    if not names:
        raise RolloutShapeError("the pod template has no containers")
    if wanted:
        if wanted not in names:
            raise RolloutShapeError(f"container {wanted!r} is not in the pod template (containers: {', '.join(names)})")
        return wanted
    if len(names) == 1:
        return names[0]
    labels = ((template or {}).get("metadata") or {}).get("labels") or {}
    for hint in (rollout_name, labels.get(NAME_LABEL)):
        if hint and hint in names:
            return hint
    apps = [n for n in names if n not in KNOWN_SIDECARS]
    if len(apps) == 1:
        return apps[0]
    raise RolloutShapeError(f"the pod template has several containers ({', '.join(names)}) and none is clearly the "
                            f"application: name it with --container")


def container_images(template: dict | None) -> dict[str, str]:
    """{container name: image} for every container (init and regular) of a pod template."""
    spec = (template or {}).get("spec") or {}
    return {c.get("name"): c.get("image") for key in ("initContainers", "containers")
            for c in spec.get(key) or []}


def with_image(template: dict, container: str, image: str) -> dict:
    """A copy of the template with only ``container``'s image changed."""
    out = copy.deepcopy(template)
    hit = False
    for c in (out.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            c["image"] = image
            hit = True
    if not hit:
        raise RolloutShapeError(f"container {container!r} is not in the pod template")
    return out


CONTAINER_KEYS = ("initContainers", "containers")


def _containers(template: dict | None) -> dict[tuple[str, str], dict]:
    spec = (template or {}).get("spec") or {}
    return {(key, c.get("name")): c for key in CONTAINER_KEYS for c in spec.get(key) or [] if isinstance(c, dict)}


def _where(key: str, name: str) -> str:
    return f"{'init container' if key == 'initContainers' else 'container'} {name}"


def _fields(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def template_differences(before: dict | None, after: dict | None, app: str | None = None) -> list[str]:
    """What differs between two pod templates, container by container (init containers too), then the rest of
    the pod spec and the template's labels and annotations; ``app``'s image is left out (the one change the drill
    makes).  Empty when they are the same but for that image.  Compare templates of one kind (two ReplicaSets',
    defaulted alike; or two templates of the spec): a ReplicaSet's template carries the API server's defaults."""
    out = []
    ca, cb = _containers(before), _containers(after)
    for k in [*ca, *(k for k in cb if k not in ca)]:
        where, a, b = _where(*k), ca.get(k), cb.get(k)
        if a is None or b is None:
            out.append(f"{where}: {'added' if a is None else 'removed'} (image {(b or a).get('image')})")
            continue
        if a.get("image") != b.get("image") and k[1] != app:
            out.append(f"{where}: image {a.get('image')} -> {b.get('image')}")
        other = [f for f in _fields(a, b) if f != "image"]
        if other:
            out.append(f"{where}: {', '.join(other)} differ")
    sa, sb = (before or {}).get("spec") or {}, (after or {}).get("spec") or {}
    pod = [f for f in _fields(sa, sb) if f not in CONTAINER_KEYS]
    if pod:
        out.append(f"pod spec: {', '.join(pod)} differ")
    ma, mb = (before or {}).get("metadata") or {}, (after or {}).get("metadata") or {}
    for part in ("labels", "annotations"):
        keys = _fields(ma.get(part) or {}, mb.get(part) or {})
        if keys:
            out.append(f"template {part}: {', '.join(keys)} differ")
    return out


def reverted_template(current: dict, app: str, image: str) -> dict:
    """The rollback target the drill writes: the current template with only ``app``'s image set to ``image``
    (a Git revert of the image tag); every other container, init container and field stays as it is."""
    return with_image(current, app, image)


def selector_string(selector: dict | None) -> str:
    """A label selector (matchLabels and matchExpressions) as the string list/watch calls take."""
    sel = selector or {}
    parts = [f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise RolloutShapeError(f"selector operator {op!r} of key {key!r} is not a label selector operator")
    if not parts:
        raise RolloutShapeError("the Rollout's selector selects nothing (no matchLabels, no matchExpressions)")
    return ",".join(parts)
