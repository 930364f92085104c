"""Fixes from a review of the rollout area: the factor rule's top-1 on any confidence scale (a hang), thresholds
compared with neg_entropy (meaningless), block samplers' block length from the model, ``--sampler`` help, and
Dream's timestep schedule with more steps than tokens."""

import argparse
import logging

import pytest
import torch

from dare.errors import ConfigError
from dare.models.loading import load_model
from dare.rollout import SAMPLERS, SamplerConfig, generate, select, select_factor
from dare.rollout import config as config_module


@pytest.fixture(autouse=True)
def fresh_warnings():
    config_module._WARNED.clear()
    yield
    config_module._WARNED.clear()


def test_factor_commits_the_top1_of_negative_confidences():
    confidence = torch.tensor([[-5.5, -5.4, -6.0, float("-inf")]])
    eligible = torch.tensor([[True, True, True, False]])
    chosen = select_factor(confidence, eligible, 1.0)
    assert chosen.tolist() == [[False, True, False, False]]  # was all False: the loop never progressed


def test_confidence_decoders_commit_at_least_one_whatever_the_confidences():
    eligible = torch.tensor([[True, True, False], [False, False, False]])
    nan = torch.full((2, 3), float("nan"))
    k = torch.zeros(2, dtype=torch.long)
    for decoder in ("threshold", "factor", "entropy_bounded"):
        chosen = select(decoder, nan, eligible, k)
        assert chosen.sum(-1).tolist() == [1, 0], decoder


@pytest.mark.parametrize("decoder", ["threshold", "dynamic", "factor"])
def test_threshold_decoders_reject_neg_entropy(decoder):
    with pytest.raises(ConfigError) as err:
        SamplerConfig(sampler="dream", decoder=decoder).resolved()
    assert "\n" not in str(err.value) and "neg_entropy" in str(err.value) and "fastdllm_dream" in str(err.value)
    with pytest.raises(ConfigError, match="neg_entropy"):
        SamplerConfig(sampler="dream", threshold=0.001).resolved()
    assert SamplerConfig(sampler="dream", decoder=decoder, confidence="prob").resolved().decoder == decoder


def test_every_preset_resolves_and_entropy_bounded_keeps_neg_entropy():
    for name in SAMPLERS:
        SamplerConfig(sampler=name).resolved()
    assert SamplerConfig(sampler="sdar", decoder="entropy_bounded").resolved().confidence == "neg_entropy"


@pytest.mark.parametrize("model_name, sampler, size", [("tiny:sdar", "llada2", 4), ("tiny:llada2", "sdar", 32)])
def test_block_samplers_take_the_model_block_size(model_name, sampler, size, caplog):
    model = load_model(model_name)
    from dare.rollout import resolve_config
    assert resolve_config(SamplerConfig(sampler=sampler, gen_length=16), model).block_length == size
    assert resolve_config(SamplerConfig(gen_length=16), model).block_length == size  # the family's own preset
    other = 4 if size == 32 else 8
    with caplog.at_level(logging.WARNING, logger="dare.rollout"):
        resolved = resolve_config(SamplerConfig(sampler=sampler, gen_length=16, block_length=other), model)
        generate(model, [[5, 6]], sampler=sampler, gen_length=16, block_length=other)
    assert resolved.block_length == other
    warned = [r.getMessage() for r in caplog.records if "differs from the model's block size" in r.getMessage()]
    assert warned == [f"warning: block_length={other} differs from the model's block size {size} (its training "
                      f"block size); decoding with {other}"]


def test_generate_help_lists_the_registered_samplers():
    from dare.commands.generate import BUILTIN_SAMPLERS, add_sampler_arguments

    assert set(BUILTIN_SAMPLERS) <= set(SAMPLERS)
    parser = argparse.ArgumentParser()
    add_sampler_arguments(parser, default=None)
    text = " ".join(parser.format_help().split())
    for name in SAMPLERS:
        assert name in text


def test_timestep_steps_beyond_gen_length_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="dare.rollout"):
        SamplerConfig(sampler="dream", gen_length=8, steps=100).resolved()
        SamplerConfig(sampler="llada", gen_length=8, steps=100).resolved()  # linear: steps past 8 are skipped
    warned = [r.getMessage() for r in caplog.records if "> gen_length" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("warning: steps 100 > gen_length 8: at most one token per step "
                                                      "needs only 8")


def test_generate_names_a_sampler_of_the_wrong_attention_kind_before_its_settings():
    """Before, resolving first reported a side error ("block_steps does not apply to sampler 'dream'")."""
    model = load_model("tiny:sdar")
    with pytest.raises(ConfigError, match="sampler 'dream' decodes full models; sdar is block-causal"):
        generate(model, [[5, 6, 7]], config=SamplerConfig(sampler="dream", gen_length=8, block_steps=2))


def test_harness_requests_decode_in_the_model_block_size():
    """lm-eval / OpenCompass requests resolve their sampler with the model, as ``generate`` does: a block sampler's
    block length (and the rounding of ``max_new_tokens`` to whole blocks) is the model's, and is what is recorded."""
    from dare.eval.harness import request_sampler

    model = load_model("tiny:sdar")  # block size 4; the llada2 preset's is 32
    config = request_sampler({"sampler": "llada2"}, "sdar", 10, 0, model=model)
    assert (config.block_length, config.gen_length) == (4, 12)
    assert request_sampler({"sampler": "llada2"}, "sdar", 40, 0).block_length == 32  # no model: the preset's
