"""experiments/headline.py: the README's headline table from an eval report."""

from experiments import headline


def test_headline_table_in_the_readme_format():
  sft = {
      "accuracy": 0.49609375,
      "accuracy_hard": 0.0,
      "accuracy_easy": 0.9921875,
      "pass@1": 0.48779296875,
      "tool_calls_hard": 0.0,
      "tool_calls_easy": 1.0,
      "format_error_rate": 0.0,
  }
  rl = {
      "accuracy": 0.98828125,
      "accuracy_hard": 1.0,
      "accuracy_easy": 0.9765625,
      "pass@1": 0.97314453125,
      "tool_calls_hard": 1.0,
      "tool_calls_easy": 1.0,
      "format_error_rate": float("nan"),
  }
  table = headline.headline_table(
      {"initial": {}, "sft": sft, "rl": rl},
      seed=0,
      num_samples=8,
      temperature=1.0,
  )
  assert table.splitlines() == [
      "| held-out metric (seed 0) | after SFT | after GRPO |",
      "|---|---|---|",
      "| greedy accuracy | 0.4961 | 0.9883 |",
      "| greedy accuracy, hard items | 0.0000 | 1.0000 |",
      "| greedy accuracy, easy items | 0.9922 | 0.9766 |",
      "| pass@1 (8 samples per task at temperature 1) | 0.4878 | 0.9731 |",
      "| tool calls per episode, hard / easy | 0.00 / 1.00 | 1.00 / 1.00 |",
      "| format-error rate | 0.0000 | n/a |",
  ]
