"""An algorithm setting out of range names its config key as the user writes it, with the value given: ``clip range
must satisfy 0 <= clip_low < 1, clip_high >= 0; got -0.5, None`` named neither key, ``algorithm.mc_num must be >= 1,
beta and elbo_divisor > 0`` no value, and ``masking ratio range ... t_low <= t_high`` the keys of another section
(SFT's are t_min / t_max)."""

from pathlib import Path

import pytest

from dare.errors import ConfigError
from dare.trainer.config import load_train_config

LLADA = Path(__file__).resolve().parents[1] / "configs" / "llada"


@pytest.mark.parametrize("recipe, overrides, message", [
    ("d1_tiny", ["algorithm.clip_low=-0.5"], "algorithm.clip_low must be in [0, 1); got -0.5"),
    ("d1_tiny", ["algorithm.clip_high=-1"], "algorithm.clip_high must be >= 0 (or null: clip_low); got -1.0"),
    ("d1_tiny", ["algorithm.dual_clip=0.5"], "algorithm.dual_clip must be > 1 (or null); got 0.5"),
    ("d1_tiny", ["algorithm.block_size=0"], "algorithm.block_size must be a positive integer (or null); got 0"),
    ("sft_tiny", ["algorithm.block_size=0"], "algorithm.block_size must be a positive integer (or null); got 0"),
    ("sft_tiny", ["algorithm.t_min=0.5", "algorithm.t_max=0.2"],
     "algorithm.t_min=0.5, algorithm.t_max=0.2: must satisfy 0 < t_min <= t_max <= 1"),
    ("sft_tiny", ["algorithm.schedule=foo"],
     "unknown value for algorithm.schedule 'foo'; choose from: continuous, discrete"),
    ("sft_tiny", ["algorithm.block_origin=start"],
     "unknown value for algorithm.block_origin 'start'; choose from: global, response"),
    ("vrpo_tiny", ["algorithm.beta=0"], "algorithm.beta must be > 0; got 0.0"),
    ("vrpo_tiny", ["algorithm.elbo_divisor=-1"], "algorithm.elbo_divisor must be > 0; got -1.0"),
    ("vrpo_tiny", ["algorithm.schedule=foo"],
     "unknown value for algorithm.schedule 'foo'; choose from: continuous, discrete"),
    ("coupled_grpo_tiny", ["algorithm.t_low=0.9"],
     "algorithm.t_low=0.9, algorithm.t_high=0.8: must satisfy 0 < t_low <= t_high < 1"),
    ("spg_tiny", ["algorithm.eubo_beta=0"], "algorithm.eubo_beta must be > 0; got 0.0"),
    ("spg_tiny", ["algorithm.min_t=0.9", "algorithm.max_t=0.5"],
     "algorithm.min_t=0.9, algorithm.max_t=0.5: must satisfy 0 <= min_t <= max_t <= 1"),
    ("igpo_tiny", ["algorithm.min_chunk=0"], "algorithm.min_chunk=0, algorithm.max_chunk=3: must satisfy 1 <= "
                                             "min_chunk <= max_chunk"),
    ("igpo_tiny", ["algorithm.hint_entropy_keep=2"], "algorithm.hint_entropy_keep must be in [0, 1]; got 2.0"),
    ("dtreerpo_tiny", ["algorithm.distill_tau_max=0"], "algorithm.distill_tau_max must be > 0; got 0.0"),
    ("d1_tiny", ["algorithm.name=tracerl", "algorithm.gamma=2"], "algorithm.gamma must be in [0, 1]; got 2.0"),
    ("d1_tiny", ["algorithm.name=tracerl", "algorithm.post_num=-1"], "algorithm.post_num must be >= 0; got -1"),
])
def test_an_algorithm_setting_out_of_range_names_its_key(recipe, overrides, message):
    with pytest.raises(ConfigError) as err:
        load_train_config(LLADA / f"{recipe}.yaml", overrides)
    assert str(err.value) == message


@pytest.mark.parametrize("recipe, overrides", [
    ("sft_tiny", ["algorithm.normalize=token", "algorithm.schedule=discrete", "algorithm.block_size=4"]),
    ("d1_tiny", ["algorithm.clip_low=0", "algorithm.clip_high=0.28", "algorithm.block_size=null"]),
])
def test_settings_in_range_still_load(recipe, overrides):
    load_train_config(LLADA / f"{recipe}.yaml", overrides)
