"""Peer engines of experiments/bench_peers.py: workers and shared helpers."""
