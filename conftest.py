# The project's pytest plugin (also an entry point once the package is installed).
pytest_plugins = ["drills.pytest_plugin"]
