"""The stages: the registry of every stage symattn derives, in formula order, and their texts."""

from __future__ import annotations

from .core import BY_KEY, KINDS, NAMES, Kind, plan, resolve, sections

__all__ = ["BY_KEY", "KINDS", "NAMES", "Kind", "plan", "resolve", "sections"]
