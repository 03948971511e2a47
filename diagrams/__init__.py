"""The figure style every chapter shares. See ``diagrams.style``."""

from .style import COLORS, box, figure, out_dir, save

__all__ = ["COLORS", "box", "figure", "out_dir", "save"]
