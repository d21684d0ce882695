"""Building and caching binaries from Go modules.

Each component is built through a wrapper module generated from the target's own go.mod
(its replace block and its placeholder requirements follow whatever version is asked for),
into ``$DRILLS_CACHE/<component>/<version>/``.  A build whose stamp file records this drills' fingerprint of
the component (stamps.build_fingerprint) is a no-op; one copied from another cache (``--reuse``) is checked first.
"""
from .build import CorruptBinary, Toolchain, check_built, sha256_file  # noqa: F401
from .components import BuildError, Component, UnknownVersion, components_for, resolve_controller_versions  # noqa: F401
