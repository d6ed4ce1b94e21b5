"""Models: the decoder-only transformer and its heads."""
