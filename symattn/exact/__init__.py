"""The exact derivation: every stage's value from its relation, on exact numbers."""

from __future__ import annotations

from .derivation import Derivation, Step, derive

__all__ = ["Derivation", "Step", "derive"]
