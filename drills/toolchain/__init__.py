"""Building and caching binaries from Go modules.

Each component is built through a wrapper module generated from the target's own go.mod
(its replace block and its placeholder requirements follow whatever version is asked for),
into ``$DRILLS_CACHE/<component>/<version>/``.  A build that already has its stamp file is a no-op.
"""
from .build import CorruptBinary, Toolchain, check_built, sha256_file  # noqa: F401
from .components import BuildError, Component, UnknownVersion, components_for, resolve_controller_versions  # noqa: F401
