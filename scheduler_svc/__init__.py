"""Railover central service."""

from importlib.metadata import PackageNotFoundError, version

try:
    # One version everywhere: the package's, as installed (`railover --version`,
    # OpenAPI info.version, /healthz).
    __version__ = version("railover")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
