"""DARE as a library (a researcher's script or notebook): configs built or edited in Python, hand-written step loops,
numpy numbers from a sweep, re-run notebook cells, results files and samples of the wrong benchmark. Each mistake is
one DareError, or it works; nothing trains silently on something else."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dare.errors import ConfigError, InputError
from dare.trainer import Trainer, TrainConfig, load_train_config, run_training

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
TINY_GEN = str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl")
TINY_MC = str(ROOT / "configs/lm_eval/data/tiny_mc.jsonl")
QUICK = ["trainer.max_steps=1", "trainer.progress=false", "trainer.export=false", "data.num_examples=8",
         "trainer.batch_size=4", "trainer.micro_batch_size=4", "data.max_length=32"]


def sft(tmp_path, name: str, *extra) -> TrainConfig:
    return load_train_config(SFT, [*QUICK, f"trainer.output_dir={tmp_path / name}", *extra])


def test_a_config_built_in_python_trains_and_its_edits_are_checked_then_used(tmp_path):
    """Before: TrainConfig() failed with AttributeError ('dict' has no 'name'); lr="1e-3" passed the check but
    reached torch as a string; optim.lrr=5 was silently ignored; algorithm.name="d1" on an SFT config named an
    unrelated key."""
    from dare.trainer.config import TrainerConfig

    record = run_training(TrainConfig(trainer=TrainerConfig(output_dir=str(tmp_path / "bare"), max_steps=1,
                                                            progress=False, export=False)))
    assert record["step"] == 1
    config = sft(tmp_path, "lr")
    config.optim.lr = "1e-3"
    optim = config.optim
    run_training(config)
    assert config.optim.lr == 1e-3 and config.optim is optim  # the checked value is the one trained, in place
    config = sft(tmp_path, "typo")
    config.optim.lrr = 5
    with pytest.raises(ConfigError, match=r"^unknown config key 'optim.lrr' \(set in Python\) \(did you mean "
                                          r"'optim.lr'\?\)$"):
        run_training(config)
    config = sft(tmp_path, "name")
    config.algorithm.name = "d1"
    with pytest.raises(ConfigError, match=r"^config.algorithm is a SFTConfig but its name is 'd1' \(D1Config\): "
                                          r"build the config with load_train_config"):
        run_training(config)


def test_a_hand_written_step_loop_saves_and_resumes_where_it_stopped(tmp_path):
    """Before: three train_step calls left trainer.step at 0, so save() wrote step_00000000 holding three updates
    and run_training resumed from it to train three more."""
    config = sft(tmp_path, "loop", "trainer.max_steps=3")
    trainer = Trainer(config)
    for step in range(3):
        trainer.train_step(step)
    assert trainer.step == 3 and trainer.save().name == "step_00000003"
    trainer.release_output_dir()
    record = run_training(sft(tmp_path, "loop", "trainer.max_steps=3"))
    assert record["step"] == 3 and not (tmp_path / "loop" / "checkpoints" / "step_00000006").exists()


def test_an_on_step_callback_returning_no_mapping_is_one_line(tmp_path):
    with pytest.raises(InputError, match=r"^the on_step callback returned a float \(0.5\): return a dict of metrics to log \(name: number\) or None$"):
        run_training(sft(tmp_path, "callback"), on_step=lambda trainer, record: 0.5)
    run_training(sft(tmp_path, "callback_ok"), on_step=lambda trainer, record: {"mine": 1.0})
    logged = [json.loads(line) for line in (tmp_path / "callback_ok" / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["mine"] == 1.0


def test_numpy_numbers_from_a_sweep_are_accepted_as_plain_ones():
    """Before: gen_length=np.int64(8) was 'must be a number; got np.int64(8)'."""
    from dare.models import load_model
    from dare.rollout import SamplerConfig, generate

    model = load_model("tiny:llada")
    out = generate(model, [[5, 6, 7]], gen_length=np.int64(8), seed=np.int64(3), temperature=np.float32(0.5))
    plain = generate(model, [[5, 6, 7]], gen_length=8, seed=3, temperature=float(np.float32(0.5)))
    assert torch.equal(out.completion, plain.completion)
    config = SamplerConfig(steps=np.int64(4), threshold=np.float64(0.5))
    config.check_values()
    assert type(config.steps) is int and type(config.threshold) is float
    loaded = load_train_config(SFT, {"trainer.max_steps": np.int64(2), "optim.lr": np.float32(1e-3)})
    assert type(loaded.trainer.max_steps) is int and type(loaded.optim.lr) is float
    with pytest.raises(ConfigError, match="expected an integer"):
        load_train_config(SFT, {"trainer.max_steps": np.float64(2.5)})


def test_results_write_never_replaces_a_data_file(tmp_path):
    from dare.eval import EvalResults

    results = EvalResults(benchmark="gsm8k", metrics={}, samples=[])
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    with pytest.raises(ConfigError, match="exists and is not an earlier"):
        results.write(data)
    assert data.read_text().startswith('{"question"')
    out = results.write(tmp_path / "results.json")
    assert results.write(out) == out  # an earlier results file is replaced


def test_samples_of_another_benchmarks_kind_are_refused():
    """Before: gsm8k samples on mmlu were a bare KeyError 'labels'; mmlu samples on gsm8k scored 0 silently."""
    from dare.eval import EvalConfig, evaluate, get_benchmark
    from dare.eval.run import load_for_eval

    model, tokenizer, _ = load_for_eval("tiny:llada", None, "cpu", None)
    gen = get_benchmark("gsm8k").load(TINY_GEN, limit=1)
    mc = get_benchmark("mmlu").load(TINY_MC, limit=1)
    with pytest.raises(InputError, match=r"^samples\[0\] \(id gsm8k/0\) is no multiple-choice sample"):
        evaluate(model, tokenizer, "mmlu", gen, config=EvalConfig(shots=0))
    with pytest.raises(InputError, match=r"^samples\[0\] \(id mmlu/0\) is a multiple-choice sample; gsm8k "):
        evaluate(model, tokenizer, "gsm8k", mc, config=EvalConfig(shots=0))


def test_a_notebook_cell_run_again_replaces_its_reward_and_algorithm(monkeypatch):
    """A class defined again in __main__ (a re-run cell) replaces its earlier definition; another module's class of
    the same name is still a clash."""
    from dare.algorithms import ALGORITHMS, register_algorithm
    from dare.rewards import REWARDS, Reward, RewardResult, get_reward, register_reward

    monkeypatch.setitem(REWARDS, "cell_reward", None)
    del REWARDS["cell_reward"]
    monkeypatch.setitem(ALGORITHMS, "cell_algo", None)
    del ALGORITHMS["cell_algo"]

    def cell(bonus: float):
        class CellReward(Reward):
            def score_one(self, completion, sample):
                return RewardResult(reward=bonus, correct=False)
        CellReward.__module__, CellReward.__qualname__ = "__main__", "CellReward"
        return register_reward("cell_reward")(CellReward)

    cell(1.0)
    cell(2.0)  # the cell run again
    assert get_reward("cell_reward").score_one("x", {}).reward == 2.0

    class Other(Reward):
        pass
    with pytest.raises(ValueError, match="registered twice"):
        register_reward("cell_reward")(Other)

    def algorithm_cell():
        class CellAlgo(ALGORITHMS["d1"]):
            name = "cell_algo"
        CellAlgo.__module__, CellAlgo.__qualname__ = "__main__", "CellAlgo"
        return register_algorithm(CellAlgo)

    first, second = algorithm_cell(), algorithm_cell()
    assert ALGORITHMS["cell_algo"] is second is not first
    with pytest.raises(ConfigError, match=r"register your reward with @register_reward\(\"my_reward\"\) and give"):
        get_reward(get_reward("cell_reward"))  # an instance, as a notebook holds it


def test_python_callers_get_python_hints(tmp_path):
    """apply_lora(target_modules='q_proj') named no module (peft's own error); load_model on an adapter directory
    pointed a Python caller to CLI flags only."""
    from peft import LoraConfig, get_peft_model

    from dare.models import family_of, load_model, tiny_model
    from dare.models.lora import apply_lora

    with pytest.raises(ConfigError, match=r"^target_modules='q_proj' matches no module .* use "
                                          r"target_modules='\.\*\\\.q_proj' \(it matches 2 modules\)$"):
        apply_lora(tiny_model("llada"), target_modules="q_proj")
    model = tiny_model("llada")
    adapter = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=2, target_modules=family_of(model).lora_targets)).save_pretrained(str(adapter))
    with pytest.raises(ConfigError) as err:
        load_model(str(adapter))
    assert f"load_model(BASE, adapter={str(adapter)!r})" in str(err.value)
    assert f"dare merge-lora --adapter {adapter} --out DIR" in err.value.cli_message  # the command line's wording


def test_a_tokenizers_output_may_be_passed_as_keywords():
    """Before: generate(model, **encoding) was a TypeError (missing 'prompts')."""
    from dare.models import load_model, load_tokenizer
    from dare.rollout import generate

    model, tokenizer = load_model("tiny:llada"), load_tokenizer("tiny:llada")
    tokenizer.padding_side = "left"
    encoding = tokenizer(["hello", "a longer prompt"], return_tensors="pt", padding=True)
    out = generate(model, **encoding, gen_length=8)
    same = generate(model, encoding["input_ids"], encoding["attention_mask"], gen_length=8)
    assert torch.equal(out.completion, same.completion)
    with pytest.raises(InputError, match=r"^generate needs prompts: "):
        generate(model)


def test_evaluate_decodes_without_autograd(monkeypatch):
    """evaluate() runs under torch.no_grad (a decorator once moved onto a helper by mistake): nothing it computes
    keeps a graph."""
    import dare.rollout
    from dare.eval import EvalConfig, evaluate, get_benchmark
    from dare.eval.run import load_for_eval

    seen = []

    def record_grad_mode(*args, **kwargs):
        seen.append(torch.is_grad_enabled())
        raise KeyboardInterrupt  # stop here: only the mode matters

    model, tokenizer, _ = load_for_eval("tiny:llada", None, "cpu", None)
    samples = get_benchmark("gsm8k").load(TINY_GEN, limit=1)
    monkeypatch.setattr(dare.rollout, "generate", record_grad_mode)
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, tokenizer, "gsm8k", samples, config=EvalConfig(shots=0))
    assert seen == [False] and torch.is_grad_enabled()
