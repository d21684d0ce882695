"""Kubernetes clients."""
