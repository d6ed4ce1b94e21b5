"""agentic_rl: JAX-native reinforcement learning for tool-using language-model agents."""
