"""drills: rollback drills against Argo Rollouts canaries, recorded per controller version."""

__version__ = "0.1.0"

# `pytest -p drills` loads the pytest plugin (drills.pytest_plugin); nothing loads it unasked
pytest_plugins = ["drills.pytest_plugin"]
