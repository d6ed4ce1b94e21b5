"""agentic_rl: JAX-native reinforcement learning for tool-using language-model agents."""

from agentic_rl import host_memory as _host_memory

# Freed host arrays stay in the process for the next step (glibc settings;
# AGENTIC_RL_HOST_MEMORY=return or system changes it): see host_memory.py.
HOST_MEMORY = _host_memory.apply_from_environment()
