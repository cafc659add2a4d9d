"""Kubemoot: schedules LLM work onto GPUs the way kube-scheduler schedules Pods onto Nodes."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
