"""Every config file and every documented switch value validates."""

import pytest

from agentic_rl import estimators
from agentic_rl import learner
from agentic_rl import losses
from agentic_rl import validation
from configs import default
from configs import forkme

# Every rl.advantage_estimator of the table that needs no model change (the
# value-head ones: VALUE_HEAD_SWITCHES and test_every_estimator_entry_*).
SWITCHES = (
    [
        ("advantage_estimator", name)
        for name in estimators.selected_by("rl.advantage_estimator")
        if not estimators.ESTIMATORS[name].needs_value_head
    ]
    + [
        # Every token-level policy loss (the sequence-level ones:
        # test_sequence_level_losses_require_sequence_mean).
        ("loss_type", name)
        for name, loss in losses.POLICY_LOSSES.items()
        if not loss.sequence_level
    ]
    + [
        ("loss_agg_mode", "seq-mean-token-mean"),
        ("loss_agg_mode", "seq-mean-token-sum-norm"),
        ("kl_estimator", "k1"),
        ("kl_estimator", "k2"),
        ("dual_clip", 3.0),
        ("kl_target", 0.05),
        ("kl_reward_coef", 0.01),
        ("entropy_coef", 1e-3),
        ("std_ddof", 1),
        ("num_microbatches", 2),
        ("reward_composition", "product"),
        ("reward_composition", "gdpo"),
        ("reward_noise", {"flip_p": 0.1}),
        ("dynamic_sampling_oversample", 2),
        ("dynamic_sampling_metric", "correct"),
        ("overlong_mode", "mask"),
        ("overlong_mode", "reward"),
        ("overlong_soft_cache", 8),
        ("credit", "per_turn"),
        ("pbrs_coef", 0.5),
        ("discount", 0.9),
        ("gigpo_step_weight", 0.5),
        ("behaviour_logprobs", "sampler"),
        ("behaviour_logprobs", "trainer"),
    ]
)


@pytest.mark.parametrize("arg", [None, "smoke"])
def test_config_files_validate(arg):
  validation.validate_config(default.get_config(arg))
  validation.validate_config(forkme.get_config(arg))


def test_length_bias_free_length_config_validates_and_fits_the_buffer():
  # The claim turns the filler option on; its buffer holds the longest
  # possible episode: prompt capacity 24 + 3 turns of 24 + 2 observations of
  # 12 = 120 (hand-computed), and drgrpo's budget is 3 turns of 24 tokens.
  from experiments.length_bias import config as length_bias  # noqa: PLC0415

  for arm in ("seq-mean-token-mean", "drgrpo"):
    config = length_bias.get_config(arm)
    validation.validate_config(config)
    assert config.env.filler_max == 8 and config.env.max_action_len == 24
    assert config.max_len == 120
  assert config.rl.loss_norm_constant == 72
  assert "filler_max" not in default.get_config().env  # off elsewhere


@pytest.mark.parametrize("field,value", SWITCHES)
def test_each_switch_validates(field, value):
  config = forkme.get_config()
  config.rl[field] = value
  validation.validate_config(config)


def test_policy_loss_needs_of_the_table():
  needs = {
      name: (loss.sequence_level, loss.episode_reward, loss.needs_log_partition)
      for name, loss in losses.POLICY_LOSSES.items()
  }
  assert needs == {
      "ppo": (False, False, False),
      "gspo": (True, False, False),
      "gspo_token": (False, False, False),
      "cispo": (False, False, False),
      "flowrl": (True, True, True),
  }


# A value validation refuses, for every `rl` field a policy-loss entry reads
# (`losses.PolicyLoss.fields`, `losses.SHARED_SETTINGS`).
_BAD_LOSS_SETTINGS = {
    "rl.clip_low": 1.0,
    "rl.clip_high": -0.1,
    "rl.dual_clip": 0.5,
    "rl.loss_agg_mode": "mean",
    "rl.loss_norm_constant": -1,
    "rl.flowrl_beta": 0.0,
    "rl.flowrl_clip": -0.1,
    "rl.flowrl_log_z_hidden": -1,
    "rl.flowrl_log_z_lr": 0.0,
}


def _loss_config(name):
  config = forkme.get_config()
  config.rl.loss_type = name
  if losses.POLICY_LOSSES[name].sequence_level:
    config.rl.loss_agg_mode = losses.SEQUENCE_AGG_MODE
  validation.validate_config(config)
  return config


@pytest.mark.parametrize("name", list(losses.POLICY_LOSSES))
def test_the_settings_a_policy_loss_declares_are_validated(name):
  entry = losses.POLICY_LOSSES[name]
  declared = entry.fields + losses.SHARED_SETTINGS
  every = {f for e in losses.POLICY_LOSSES.values() for f in e.fields}
  assert set(_BAD_LOSS_SETTINGS) == every | set(losses.SHARED_SETTINGS)
  for field, bad in _BAD_LOSS_SETTINGS.items():
    config = _loss_config(name)
    config.rl[field.removeprefix("rl.")] = bad
    # rl.dual_clip is checked for every loss type, read by 'ppo' only.
    if field in declared or field == "rl.dual_clip":
      with pytest.raises(ValueError, match=f"config.{field}="):
        validation.validate_config(config)
    else:
      # Another entry's setting: not this loss's concern.
      validation.validate_config(config)


@pytest.mark.parametrize(
    "loss_type",
    [n for n, loss in losses.POLICY_LOSSES.items() if loss.sequence_level],
)
def test_sequence_level_losses_require_sequence_mean(loss_type):
  config = forkme.get_config()
  config.rl.loss_type = loss_type
  with pytest.raises(ValueError, match="rl.loss_agg_mode='token-mean'"):
    validation.validate_config(config)
  config.rl.loss_agg_mode = "seq-mean-token-mean"
  validation.validate_config(config)


@pytest.mark.parametrize(
    "field,value",
    [
        ("advantage_estimator", "ppo"),
        ("loss_type", "dpo"),
        ("loss_agg_mode", "mean"),
        ("kl_estimator", "k4"),
        ("dual_clip", 0.5),
        ("credit", "per_token"),
        ("discount", 1.5),
    ],
)
def test_unknown_switch_values_are_rejected(field, value):
  config = forkme.get_config()
  config.rl[field] = value
  with pytest.raises(ValueError, match=f"config.rl.{field}="):
    validation.validate_config(config)


def test_reward_switches_validate_and_reject():
  config = forkme.get_config()
  config.rl.rewards = {"otc": 1.0, "tool_bonus": 1.0, "format": 0.1}
  config.rl.reward_params = {"otc": {"c": 2.0}}
  config.rl.reward_schedules = {
      "tool_bonus": {"kind": "linear", "start": 0.2, "end": 0.0, "steps": 30}
  }
  validation.validate_config(config)
  config.rl.reward_schedules = {"tool_bonus": {"kind": "exp"}}
  with pytest.raises(ValueError, match="exp"):
    validation.validate_config(config)
  config.rl.reward_schedules = {}
  config.rl.reward_composition = "max"
  with pytest.raises(ValueError, match="max"):
    validation.validate_config(config)


# Switches that need a companion setting, as shown in configs/forkme.py.
COMBINED_SWITCHES = [
    {"dynamic_sampling_oversample": 2, "dynamic_sampling_max_retries": 2},
    {"replay_capacity": 64, "replay_inject": True, "sil_coef": 0.1},
    {"dual_constraint": "num_tool_calls", "dual_target": 0.5},
    {"dual_constraint": "num_tool_errors", "dual_sense": "min"},
    {"pbrs_coef": 0.5, "dense_as": "aux_loss"},
    {"pbrs_coef": 0.5, "credit": "per_turn", "dense_as": "aux_loss"},
    {"tree_branching": (2, 4), "tree_alpha": 1.0},
    {"loss_type": "flowrl", "loss_agg_mode": "seq-mean-token-mean"},
    {
        "loss_type": "flowrl",
        "loss_agg_mode": "seq-mean-token-mean",
        "flowrl_log_z_hidden": 0,
        "flowrl_beta": 1.0,
    },
]

# Switches that need the model's value head (model.value_head=True).
VALUE_HEAD_SWITCHES = [
    {"advantage_estimator": "gae"},
    {
        "advantage_estimator": "gae",
        "gae_lambda": 1.0,
        "value_clip": 0.0,
        "discount": 0.99,
    },
    {"pbrs_coef": 0.5, "pbrs_potential": "value", "credit": "per_turn"},
]

BAD_COMBINED = [
    ({"dynamic_sampling_max_retries": 2}, "dynamic_sampling_max_retries"),
    (
        {"dynamic_sampling_oversample": 2, "dynamic_sampling_max_retries": -1},
        "dynamic_sampling_max_retries",
    ),
    ({"replay_inject": True}, "replay_capacity"),
    ({"sil_coef": 0.1}, "replay_capacity"),
    ({"replay_capacity": -1}, "replay_capacity"),
    ({"replay_capacity": 8, "sil_coef": -1.0}, "sil_coef"),
    (
        {"replay_capacity": 8, "sil_coef": 0.1, "sil_batch_size": 0},
        "sil_batch_size",
    ),
    (
        {"replay_capacity": 8, "replay_inject": True, "credit": "per_turn"},
        "replay_inject",
    ),
    (
        {
            "replay_capacity": 8,
            "replay_inject": True,
            "dual_constraint": "num_tool_calls",
        },
        "replay_inject",
    ),
    ({"dual_constraint": "tool_call_turn"}, "dual_constraint"),
    ({"dual_constraint": "calls"}, "dual_constraint"),
    ({"dual_constraint": "num_tool_calls", "dual_sense": "up"}, "dual_sense"),
    ({"dual_constraint": "num_tool_calls", "dual_lr": 0.0}, "dual_lr"),
    ({"dual_constraint": "num_tool_calls", "dual_init": -1.0}, "dual_init"),
    ({"pbrs_potential": "bogus"}, "pbrs_potential"),
    ({"pbrs_coef": 0.5, "pbrs_potential": "value"}, "pbrs_potential"),
    ({"advantage_estimator": "gae"}, "advantage_estimator"),
    ({"behaviour_logprobs": "vllm"}, "behaviour_logprobs"),
    ({"loss_type": "flowrl"}, "loss_agg_mode"),
    (
        {
            "loss_type": "flowrl",
            "loss_agg_mode": "seq-mean-token-mean",
            "credit": "per_turn",
        },
        "loss_type",
    ),
    (
        {
            "loss_type": "flowrl",
            "loss_agg_mode": "seq-mean-token-mean",
            "flowrl_beta": 0.0,
        },
        "flowrl_beta",
    ),
    (
        {
            "loss_type": "flowrl",
            "loss_agg_mode": "seq-mean-token-mean",
            "flowrl_log_z_hidden": -1,
        },
        "flowrl_log_z_hidden",
    ),
    ({"dense_as": "bonus"}, "dense_as"),
    ({"likelihood_coef": -0.1}, "likelihood_coef"),
    ({"gigpo_step_weight": -1.0}, "gigpo_step_weight"),
    ({"tree_branching": (2, 2)}, "tree_branching"),
    ({"tree_branching": (8, 0)}, "tree_branching"),
    ({"tree_branching": (2, 4), "tree_alpha": 2.0}, "tree_alpha"),
    (
        {"tree_branching": (2, 4), "advantage_estimator": "rloo"},
        "tree_branching",
    ),
    (
        {"advantage_estimator": "gigpo", "credit": "per_turn"},
        "advantage_estimator",
    ),
]


@pytest.mark.parametrize("values", COMBINED_SWITCHES)
def test_combined_switches_validate(values):
  config = forkme.get_config()
  config.rl.update(values)
  validation.validate_config(config)


@pytest.mark.parametrize("values,field", BAD_COMBINED)
def test_bad_combined_switches_name_the_field(values, field):
  config = forkme.get_config()
  config.rl.update(values)
  with pytest.raises(ValueError, match=f"config.rl.{field}="):
    validation.validate_config(config)


@pytest.mark.parametrize("values", VALUE_HEAD_SWITCHES)
def test_value_head_switches_validate_and_need_the_head(values):
  config = forkme.get_config()
  config.rl.update(values)
  with pytest.raises(ValueError, match="value_head=True"):
    validation.validate_config(config)
  config.model.value_head = True
  validation.validate_config(config)


@pytest.mark.parametrize(
    "values,field",
    [
        ({"advantage_estimator": "gae", "gae_lambda": 1.5}, "gae_lambda"),
        ({"advantage_estimator": "gae", "value_coef": 0.0}, "value_coef"),
        ({"advantage_estimator": "gae", "value_clip": -0.1}, "value_clip"),
        (
            {"advantage_estimator": "gae", "credit": "per_turn"},
            "advantage_estimator",
        ),
        ({"advantage_estimator": "gae", "pbrs_coef": 0.5}, "pbrs_coef"),
    ],
)
def test_bad_value_head_switches_name_the_field(values, field):
  config = forkme.get_config()
  config.model.value_head = True
  config.rl.update(values)
  with pytest.raises(ValueError, match=f"config.rl.{field}="):
    validation.validate_config(config)


# ---------------------------------------------------------------------------
# The estimator table's declared needs, read by validation.
# ---------------------------------------------------------------------------


def test_advantage_estimator_names_of_the_table():
  assert estimators.selected_by("rl.advantage_estimator") == (
      "grpo",
      "drgrpo",
      "rloo",
      "reinforce_pp",
      "reinforce_pp_baseline",
      "hdpo",
      "gigpo",
      "gae",
  )
  assert estimators.selected_by("rl.credit") == ("per_turn",)
  assert estimators.selected_by("rl.tree_branching") == ("tree",)


def _select(config, name):
  """Sets the config fields that select table entry `name`, with its needs
  met (value head, base estimator); returns the field that selects it."""
  entry = estimators.ESTIMATORS[name]
  rl = config.rl
  if entry.selected_by == "rl.advantage_estimator":
    rl.advantage_estimator = name
  else:
    rl.advantage_estimator = entry.base_estimators[0]
    if entry.selected_by == "rl.credit":
      rl.credit = "per_turn"
    else:
      rl.tree_branching = (2, 4)
  config.model.value_head = entry.needs_value_head
  assert learner.estimator_name(rl) == name
  return entry.selected_by


@pytest.mark.parametrize("name", list(estimators.ESTIMATORS))
def test_every_estimator_entry_validates_with_its_needs_met(name):
  config = forkme.get_config()
  _select(config, name)
  validation.validate_config(config)
  settings = learner.estimator_settings(estimators.ESTIMATORS[name], config.rl)
  assert set(settings) == set(estimators.ESTIMATORS[name].settings)


@pytest.mark.parametrize("name", list(estimators.ESTIMATORS))
def test_every_estimator_entry_refuses_what_it_cannot_take(name):
  entry = estimators.ESTIMATORS[name]
  refused = []
  if entry.needs_value_head:
    refused.append(({"value_head": False}, "rl.advantage_estimator"))
  if not entry.takes_potential:
    field = "rl.pbrs_coef"
    if entry.selected_by != "rl.advantage_estimator":
      field = entry.selected_by
    refused.append(({"pbrs_coef": 0.5}, field))
  if entry.reads_facts or entry.needs_sampled_rows:
    field = "rl.replay_inject"
    if entry.needs_sampled_rows:
      field = entry.selected_by
    refused.append(({"replay_capacity": 8, "replay_inject": True}, field))
  if entry.level != "episode":
    for loss_type, loss in losses.POLICY_LOSSES.items():
      if loss.episode_reward:
        agg = "seq-mean-token-mean" if loss.sequence_level else "token-mean"
        refused.append(
            ({"loss_type": loss_type, "loss_agg_mode": agg}, "rl.loss_type")
        )
  for values, field in refused:
    config = forkme.get_config()
    _select(config, name)
    if "value_head" in values:
      config.model.value_head = values["value_head"]
    else:
      config.rl.update(values)
    with pytest.raises(ValueError, match=f"config.{field}="):
      validation.validate_config(config)


@pytest.mark.parametrize(
    "field", ["rl.credit", "rl.tree_branching"], ids=["credit", "tree"]
)
def test_replacing_entries_refuse_other_estimators(field):
  """An entry selected by rl.credit / rl.tree_branching runs only with an
  rl.advantage_estimator of its base_estimators."""
  entry = estimators.ESTIMATORS[estimators.entry_for(field)]
  named = {"rl.credit": "rl.advantage_estimator"}.get(field, field)
  others = [
      n
      for n in estimators.selected_by("rl.advantage_estimator")
      if n not in entry.base_estimators
  ]
  assert others
  for other in others:
    config = forkme.get_config()
    _select(config, estimators.entry_for(field))
    config.rl.advantage_estimator = other
    config.model.value_head = estimators.ESTIMATORS[other].needs_value_head
    with pytest.raises(ValueError, match=f"config.{named}="):
      validation.validate_config(config)
