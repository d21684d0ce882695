"""The embedded cluster's errors: a runtime failure (exit 1) or bad input and refused starts (exit 2)."""
from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster could not be brought up or reached (a runtime failure)."""


class ControlPlaneExited(ClusterError):
    """A control-plane process exited while the cluster started (seen on a loaded machine: the
    kube-controller-manager gives up when the kube-apiserver's /healthz is slow); one more start is tried."""


class ClusterInputError(ClusterError):
    """Bad input or a refused start: an occupied port, a missing binary, an unknown version (exit 2)."""


class ClusterInUse(ClusterInputError):
    """`up` would replace a cluster someone uses (a run, a probe, a test session, a drill's lease): exit 2."""


class ClusterStateError(ClusterInputError):
    """The cluster's state file is not what drills writes (a field of the wrong type): exit 2."""


__all__ = ["ClusterError", "ClusterInUse", "ClusterInputError", "ClusterStateError", "ControlPlaneExited"]
