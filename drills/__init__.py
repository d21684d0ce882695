"""drills: rollback drills against Argo Rollouts canaries, recorded per controller version."""

__version__ = "0.1.0"
