"""Text and token conventions shared by the environments and the RL library.

tokenizers: the byte-level tokenizer with tool/answer special tokens and a
  Hugging Face tokenizer.json wrapper.
chat: ChatML rendering to token ids turn by turn, with a role per token.
roles: the per-token roles (prompt, policy, tool, template) a trajectory carries.

The lowest layer of the import graph (docs/design.md, "Layers"): it imports
neither `agentic_rl` nor `environments`.
"""
