"""Host environments: Python tools driven turn by turn (docs/design.md).

Each environment here declares `is_host = True`; the rollout for it is
agentic_rl/host_rollout.py. See README.md in this folder.
"""
