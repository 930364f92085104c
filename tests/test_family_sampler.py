"""An unset ``SamplerConfig.sampler`` is the model family's default sampler, wherever the model is known.

Before, ``SamplerConfig()`` meant the ``llada`` preset: from Python a Dream model decoded with LLaDA's schedule and
confidence unless told otherwise, an SDAR model was refused, ``evaluate`` gave a sampler without ``gen_length`` 128
tokens instead of the benchmark's ``max_new_tokens``, and an RL recipe on Dream without ``rollout.sampler.sampler``
rolled out with the LLaDA preset.
"""

from __future__ import annotations

import pytest
import torch

from dare.config import load_yaml
from dare.errors import ConfigError
from dare.models.loading import family_of_path, load_model
from dare.rollout import SamplerConfig, generate
from dare.rollout.config import DEFAULT_GEN_LENGTH


def prompts(vocab: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(10, vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def test_generate_decodes_with_the_models_family_sampler():
    dream = load_model("tiny:dream")
    ids, mask = prompts()
    settings = dict(gen_length=8, steps=8, eos_early_stop=False)
    unset = generate(dream, ids, mask, SamplerConfig(**settings))
    explicit = generate(dream, ids, mask, SamplerConfig(sampler="dream", **settings))
    llada = generate(dream, ids, mask, SamplerConfig(sampler="llada", **settings))
    assert torch.equal(unset.completion, explicit.completion)
    assert not torch.equal(unset.completion, llada.completion)  # the old default decoded other tokens
    # a block-diffusion model was refused ("sampler 'llada' decodes full-attention models")
    sdar = load_model("tiny:sdar")
    out = generate(sdar, ids, mask, gen_length=8)
    assert torch.equal(out.completion, generate(sdar, ids, mask, sampler="sdar", gen_length=8).completion)


def test_an_unset_gen_length_is_128_and_a_config_without_a_model_must_name_its_sampler():
    assert SamplerConfig(sampler="llada").resolved().gen_length == DEFAULT_GEN_LENGTH == 128
    with pytest.raises(ConfigError, match="sampler is unset and there is no model .* name one \\(dream, fastdllm"):
        SamplerConfig(gen_length=8).resolved()
    assert SamplerConfig().for_family("dream").sampler == "dream"
    assert SamplerConfig(sampler="fastdllm").for_family("dream").sampler == "fastdllm"  # a named one is kept
    assert SamplerConfig().for_family("llada2").sampler == "llada2"


def test_evaluate_takes_the_benchmarks_max_new_tokens_when_the_sampler_leaves_gen_length_unset():
    from dare.eval import EvalConfig, evaluate, get_benchmark
    from dare.models.loading import load_tokenizer

    model, tokenizer = load_model("tiny:dream"), load_tokenizer("tiny:dream")
    bench = get_benchmark("gsm8k")
    samples = [bench.parse_row({"question": "1 + 1?", "answer": "#### 2"}, 0)]
    results = evaluate(model, tokenizer, bench, samples, sampler=SamplerConfig(steps=4, block_length=None),
                       config=EvalConfig(shots=0))
    settings = results.sampler["settings"]
    assert results.sampler["name"] == "dream"
    assert settings["gen_length"] == bench.generation_defaults(None).max_new_tokens != DEFAULT_GEN_LENGTH


def test_the_family_of_a_path_is_read_from_its_config_alone(tmp_path):
    from dare.models.tiny import write_tiny_checkpoint

    assert family_of_path("tiny:sdar").name == "sdar"
    write_tiny_checkpoint("dream", tmp_path / "ckpt")
    assert family_of_path(str(tmp_path / "ckpt")).name == "dream"
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        family_of_path(str(tmp_path / "missing"))


def rl_config(tmp_path, recipe: str, *overrides):
    from pathlib import Path

    from dare.trainer import load_train_config

    root = Path(__file__).resolve().parents[1]
    return load_train_config(str(root / recipe), [
        f"trainer.output_dir={tmp_path}", "trainer.progress=false", "trainer.export=false", "trainer.max_steps=1",
        "trainer.batch_size=4", "trainer.micro_batch_size=4", "algorithm.inner_steps=1", *overrides])


def test_a_recipe_without_a_rollout_sampler_rolls_out_with_the_familys_and_config_yaml_says_which(tmp_path):
    from dare.trainer import Trainer

    used = []
    config = rl_config(tmp_path / "dream", "configs/dream/coupled_grpo_tiny.yaml", "rollout.sampler.sampler=null",
                       "rollout.sampler.gen_length=null")
    trainer = Trainer(config)
    generate_ = trainer.algorithm.generate

    def spy(policy, ids, attn, sampler, **kwargs):
        used.append(sampler)
        return generate_(policy, ids, attn, sampler, **kwargs)

    trainer.algorithm.generate = spy
    trainer.train()
    assert [(s.sampler, s.gen_length) for s in used] == [("dream", DEFAULT_GEN_LENGTH)]
    recorded = load_yaml(tmp_path / "dream" / "config.yaml")["rollout"]["sampler"]
    assert (recorded["sampler"], recorded["gen_length"]) == ("dream", DEFAULT_GEN_LENGTH)


def test_llada_recipes_record_what_they_recorded_before_so_old_runs_resume(tmp_path, capsys):
    """A d1 run written when the default was ``llada`` (config.yaml holds it) resumes unchanged."""
    from dare.cli import main

    args = ["train", "configs/llada/d1_tiny.yaml", "rollout.sampler.sampler=null", "trainer.progress=false",
            f"trainer.output_dir={tmp_path}", "trainer.batch_size=8", "trainer.micro_batch_size=8",
            "algorithm.inner_steps=1"]
    assert main([*args, "trainer.max_steps=1"]) == 0, capsys.readouterr().err
    recorded = load_yaml(tmp_path / "config.yaml")["rollout"]["sampler"]
    assert recorded["sampler"] == "llada"
    # the dry run shows the filled-in sampler and accepts the directory
    assert main([*args, "trainer.max_steps=2", "--dry-run"]) == 0
    assert "    sampler: llada\n" in capsys.readouterr().out


def test_the_rollout_section_of_an_algorithm_without_rollouts_does_not_block_its_resume():
    """config.yaml of an SFT run written before recorded rollout.sampler.sampler=llada; now it records null."""
    from dare.trainer.resume import differing_keys

    old = {"algorithm": {"name": "sft"}, "rollout": {"sampler": {"sampler": "llada", "gen_length": 128}}}
    new = {"algorithm": {"name": "sft"}, "rollout": {"sampler": {"sampler": None, "gen_length": None}}}
    assert differing_keys(old, new) == []
    rl_old, rl_new = ({**settings, "algorithm": {"name": "d1"}} for settings in (old, new))
    assert differing_keys(rl_old, rl_new) == ["rollout.sampler.gen_length", "rollout.sampler.sampler"]
