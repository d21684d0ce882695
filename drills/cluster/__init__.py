"""The target cluster: the embedded default (kwokctl binary runtime + the real rollouts controller)
or a live cluster reached through a kubeconfig."""
from .availability import Availability  # noqa: F401
from .embedded import (  # noqa: F401
    ClusterError,
    ClusterInputError,
    ClusterInUse,
    ClusterStateError,
    EmbeddedCluster,
    free_port,
    pid_alive,
)
