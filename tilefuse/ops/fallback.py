"""Ops declared for the fallback frontend (see the module docstring of tilefuse.ops)."""
