"""The recording Kubernetes API stand-in (tests/fleet/conftest.py), for the RBAC check."""

from tests.fleet.conftest import k8s

__all__ = ["k8s"]
