"""Experiment-side helpers around the multi-seed trainer (agentic_rl/seeds.py).

`config_hash` names an experiment's settings in results.json
(experiments/harness.py, experiments/rm_selection).
"""

from __future__ import annotations

import hashlib
import json

import ml_collections


def config_hash(config: ml_collections.ConfigDict) -> str:
  """First 12 hex digits of the SHA-1 of the config's sorted-key JSON (a stable
  identifier of an experiment's settings for results.json)."""
  blob = json.dumps(json.loads(config.to_json_best_effort()), sort_keys=True)
  return hashlib.sha1(blob.encode()).hexdigest()[:12]
