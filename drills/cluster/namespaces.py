"""Drill namespaces: named apart, carrying the opt-in label, removed together with their availability holds."""
from __future__ import annotations

import re
import uuid

from ..kube import k8s
from ..kube.k8s import client

from ..core import config
from .availability import Availability

OPT_IN_VALUE = "true"


def namespace_name(prefix: str) -> str:
    """A fresh DNS-label name: the prefix, cleaned and cut, plus a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40].strip("-") or "drill"
    return f"{base}-{uuid.uuid4().hex[:5]}"


def make_namespace(api: client.ApiClient, name: str) -> str:
    client.CoreV1Api(api).create_namespace(
        {"metadata": {"name": name, "labels": {config.NAMESPACE_OPT_IN_LABEL: OPT_IN_VALUE}}})
    return name


def drop_namespace(api: client.ApiClient, name: str) -> None:
    """Remove the namespace and every availability hold of it (a namespace already gone is fine)."""
    try:
        Availability(api).clear(name)
    except k8s.ApiException:
        pass
    try:
        client.CoreV1Api(api).delete_namespace(name)
    except k8s.ApiException as e:
        if e.status != 404:
            raise
