"""Environments: one per file; `base.py` holds the protocol."""
