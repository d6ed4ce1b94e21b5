"""Roles of the tokens in a trajectory (int8 values of Trajectory.role).

Who produced each token: the chat renderer (agentic_text/chat.py) and the
environments assign them, the RL library trains only POLICY tokens.
agentic_rl.types binds these names next to the Trajectory that carries them.
"""

PAD = 0  # padding after the episode's last token
PROMPT = 1  # system / user text (the task)
POLICY = 2  # sampled by the policy: the only tokens ever trained
TOOL = 3  # tool observations written by the environment
TEMPLATE = 4  # chat scaffolding (turn markers, role names, newlines)
