"""Kubernetes clients.  The client library's packages are served lazily from the first import of this package
(drills.kube.lazy_client): a process pays for the API classes and models it uses, not for all ~870 modules."""
from .lazy_client import install as _serve_the_client_lazily

_serve_the_client_lazily()
