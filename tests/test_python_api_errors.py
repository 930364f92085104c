"""A new user calling DARE's Python API with arguments of the wrong type gets a one-line ConfigError / InputError
naming the argument, what it got and what to pass - never an AttributeError or TypeError from deep inside the
library, never a silently truncated value - and messages name Python arguments, not command-line flags."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)

from dare.errors import ConfigError, DareError, InputError
from dare.eval import EvalConfig, LikelihoodConfig, evaluate, get_benchmark
from dare.models import load_model, load_tokenizer
from dare.rollout import SamplerConfig, generate

ROOT = Path(__file__).resolve().parents[1]
TINY_GEN = str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl")
TINY_MC = str(ROOT / "configs/lm_eval/data/tiny_mc.jsonl")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
FOUR = SamplerConfig(gen_length=4)
ZERO_SHOT = EvalConfig(shots=0)


def one_line(error: type[DareError], call, *words: str) -> str:
    """The message of the ``error`` that ``call()`` raises; it is one line and holds every one of ``words``."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and all(word in message for word in words), message
    return message


@pytest.fixture(scope="module")
def llada():
    return load_model("tiny:llada"), load_tokenizer("tiny:llada")


@pytest.fixture(scope="module")
def gsm8k():
    bench = get_benchmark("gsm8k")
    return bench, bench.load(TINY_GEN, limit=2)


# ------------------------------------------------------------------------------------ dare.eval.evaluate

EVALUATE_CASES = [  # (name, changes to a good call, error, words of the message)
    ("sampler dict", dict(sampler={"gen_length": 4}), ConfigError,
     ("sampler must be a SamplerConfig or None; got a dict", "SamplerConfig.from_dict(d)")),
    ("sampler name", dict(sampler="fastdllm"), ConfigError,
     ("got the string 'fastdllm'", "SamplerConfig(sampler='fastdllm'")),
    ("config dict", dict(config={"shots": 0}), ConfigError,
     ("config must be an EvalConfig or None; got a dict", "EvalConfig.from_dict(d)")),
    ("config is a sampler", dict(config=FOUR), ConfigError, ("config must be an EvalConfig", "got a SamplerConfig")),
    ("likelihood dict", dict(likelihood={"mc_samples": 2}), ConfigError, ("LikelihoodConfig.from_dict(d)",)),
    ("rows", dict(samples=[{"question": "1 + 1?", "answer": "2"}]), InputError,
     ("samples[0] must be a Sample; got a dict", "parse_row")),
    ("texts", dict(samples=["1 + 1?"]), InputError, ("samples[0] must be a Sample; got the string '1 + 1?'",)),
    ("a path", dict(samples=TINY_GEN), InputError, ("samples must be a list of Samples", "benchmark.load(path)")),
    ("a generator", dict(samples=(s for s in ())), InputError, ("got a generator", "list(...)")),
    ("benchmark", dict(benchmark=3), ConfigError, ("benchmark must be a Benchmark or its name", "got an int (3)")),
    ("model path", dict(model="tiny:llada"), InputError,
     ("model must be a DARE model; got the string 'tiny:llada'", "load_model('tiny:llada')")),
    ("tokenizer path", dict(tokenizer="tiny:llada"), InputError,
     ("tokenizer must be a tokenizer; got the string", "load_tokenizer('tiny:llada')")),
    ("no tokenizer", dict(tokenizer=None), InputError, ("tokenizer must be a tokenizer; got None",)),
    ("pool rows", dict(fewshot_pool=[{"question": "q", "answer": "1"}]), InputError,
     ("fewshot_pool[0] must be a Sample",)),
    ("pool path", dict(fewshot_pool="train.jsonl"), InputError, ("fewshot_pool must be a list of Samples",)),
    ("reward options", dict(reward_options=["workers", 2]), ConfigError, ("reward_options must be a dict or None",)),
    ("model info", dict(model_info="tiny"), InputError, ("model_info must be a dict or None",)),
    ("data info", dict(data_info="tiny"), InputError, ("data_info must be a dict or None",)),
    ("fewshot source", dict(fewshot_source=3), InputError, ("fewshot_source must be a string or None",)),
    ("shots text", dict(config=EvalConfig(shots="2")), ConfigError, ("EvalConfig.shots", "expected an integer")),
    ("shots float", dict(config=EvalConfig(shots=1.5)), ConfigError, ("EvalConfig.shots", "expected an integer")),
    ("batch text", dict(config=EvalConfig(shots=0, batch_size="8")), ConfigError, ("EvalConfig.batch_size",)),
    ("one k", dict(config=EvalConfig(shots=0, ks=1)), ConfigError, ("EvalConfig.ks", "expected a list")),
    ("chat text", dict(config=EvalConfig(shots=0, chat="yes")), ConfigError, ("EvalConfig.chat", "true/false")),
]


@pytest.mark.parametrize("name, changes, error, words", EVALUATE_CASES, ids=[c[0] for c in EVALUATE_CASES])
def test_evaluate_arguments_of_the_wrong_type_are_one_line_errors(name, changes, error, words, llada, gsm8k):
    """Before: AttributeError ('dict' object has no attribute 'seed', ...), TypeError, or silently accepted
    (a fewshot source that is no string, shots=1.5)."""
    model, tokenizer = llada
    bench, samples = gsm8k
    if name == "likelihood dict":
        bench, samples = get_benchmark("mmlu"), get_benchmark("mmlu").load(TINY_MC, limit=1)
    call = dict(model=model, tokenizer=tokenizer, benchmark=bench, samples=samples, sampler=FOUR, config=ZERO_SHOT)
    call.update(changes)
    args = [call.pop(k) for k in ("model", "tokenizer", "benchmark", "samples")]
    one_line(error, lambda: evaluate(*args, **call), *words)


def test_model_and_tokenizer_swapped_one_sample_and_config_dicts(llada, gsm8k):
    model, tokenizer = llada
    bench, samples = gsm8k
    one_line(InputError, lambda: evaluate(tokenizer, model, bench, samples, sampler=FOUR, config=ZERO_SHOT),
             "model must be a DARE model", "swapped")
    one_line(InputError, lambda: evaluate(model, tokenizer, bench, samples[0], sampler=FOUR, config=ZERO_SHOT),
             "samples must be a list of Samples; got a Sample", "[sample]")
    one_line(ConfigError, lambda: EvalConfig.from_dict({"shot": 2}), "did you mean 'EvalConfig.shots'")
    assert EvalConfig.from_dict({"shots": 2, "ks": [1]}) == EvalConfig(shots=2, ks=(1,))


@pytest.mark.parametrize("field, value, words", [
    ("t_min", "a", ("LikelihoodConfig.t_min must be a number",)),
    ("stratified", "no", ("LikelihoodConfig.stratified must be True or False",)),  # before: 'no' taken for True
    ("length_norm", ["chars"], ("LikelihoodConfig.length_norm must be a string",)),
])
def test_likelihood_config_fields_of_the_wrong_type(field, value, words):
    one_line(ConfigError, lambda: LikelihoodConfig(**{field: value}).validated(), *words)


# ------------------------------------------------------------------------------------ dare.rollout.generate

IDS = [[1, 2, 3], [4, 5]]
TENSOR = torch.tensor([[1, 2, 3], [4, 5, 6]])
GENERATE_CASES = [  # (name, positional arguments after the model, keyword arguments, error, words)
    ("config dict", (IDS,), dict(config={"gen_length": 4}), ConfigError,
     ("config must be a SamplerConfig or None; got a dict", "SamplerConfig.from_dict(d)")),
    ("config name", (IDS, None, "dream"), {}, ConfigError, ("got the string 'dream'", "sampler='dream'")),
    ("text", ("What is 1 + 1?",), dict(config=FOUR), InputError, ("prompts must be token ids", "tokenize it first")),
    ("texts", (["What is 1 + 1?"],), dict(config=FOUR), InputError,
     ("prompts[0] must be a list of token ids", "tokenize")),
    ("flat ids", ([1, 2, 3],), dict(config=FOUR), InputError, ("prompts[0]", "got an int (1)", "[ids]")),
    ("tokenizer output", ({"input_ids": IDS},), dict(config=FOUR), InputError, ("['input_ids']",)),
    ("numpy", (np.array(IDS[:1]),), dict(config=FOUR), InputError, ("torch.as_tensor(prompts)",)),
    ("float ids", ([[1.5, 2.0]],), dict(config=FOUR), InputError, ("prompts[0] must be a list of integer token ids",)),
    ("config as mask", (TENSOR, FOUR), {}, InputError, ("attention_mask must be a tensor or None", "config=")),
    ("list mask", (TENSOR, [[1, 1, 1], [1, 1, 1]], FOUR), {}, InputError, ("attention_mask", "torch.as_tensor(mask)")),
    ("mask of 2s", (TENSOR, torch.full((2, 3), 2), FOUR), {}, InputError, ("0 (padding) and 1 (prompt token)",)),
    ("text example ids", (IDS,), dict(config=FOUR, example_ids=["a", "b"]), InputError,
     ("example_ids[0] must be an integer; got the string 'a'",)),
    ("float example ids", (IDS,), dict(config=FOUR, example_ids=[0.5, 1.5]), InputError,
     ("example_ids[0] must be an integer",)),
    ("one example id", (IDS,), dict(config=FOUR, example_ids=3), InputError,
     ("example_ids must be a list of integers",)),
    ("float tensor example ids", (IDS,), dict(config=FOUR, example_ids=torch.tensor([0.5, 1.0])), InputError,
     ("example_ids must be", "torch.float32")),
    ("list canvas", (IDS,), dict(config=FOUR, canvas=[[259] * 4] * 2), InputError,
     ("canvas must be a [B, gen_length]",)),
    ("float canvas", (IDS,), dict(config=FOUR, canvas=torch.full((2, 4), 259.0)), InputError,
     ("canvas must hold integer token ids",)),
    ("canvas beyond vocab", (IDS,), dict(config=FOUR, canvas=torch.full((2, 4), 10**6)), InputError,
     ("canvas ids must lie in [0, 264)",)),
    ("one step", (IDS,), dict(config=FOUR, step_range=2), InputError, ("step_range must be a pair (start, stop)",)),
    ("three steps", (IDS,), dict(config=FOUR, step_range=(0, 1, 2)), InputError, ("step_range must be a pair",)),
    ("float steps", (IDS,), dict(config=FOUR, step_range=(0.5, 2)), InputError, ("step_range must be a pair", "0.5")),
]


@pytest.mark.parametrize("name, args, kwargs, error, words", GENERATE_CASES, ids=[c[0] for c in GENERATE_CASES])
def test_generate_arguments_of_the_wrong_type_are_one_line_errors(name, args, kwargs, error, words, llada):
    """Before: AttributeError ('dict' object has no attribute 'resolved'), ValueError (too many dimensions 'str'),
    or silently truncated (ids 1.5 -> 1, example ids 0.5 -> 0, a float canvas, step_range (0.5, 2))."""
    model, _ = llada
    one_line(error, lambda: generate(model, *args, **kwargs), *words)


def test_generate_with_a_model_path_or_a_tokenizer(llada):
    _, tokenizer = llada
    one_line(InputError, lambda: generate("tiny:llada", IDS, config=FOUR), "model must be a DARE model",
             "load_model('tiny:llada')")
    one_line(InputError, lambda: generate(tokenizer, IDS, config=FOUR), "swapped")


# ------------------------------------------------------------------------------------ models, trainer, rewards

def test_load_model_paths_adapters_and_dtypes_of_the_wrong_type(llada):
    model, _ = llada
    one_line(ConfigError, lambda: load_model(model), "path must be a checkpoint directory", "loaded model")
    one_line(ConfigError, lambda: load_model(None), "path must be a checkpoint directory", "got None")
    one_line(ConfigError, lambda: load_model("tiny:llada", True), "adapter must be a LoRA adapter directory")
    one_line(ConfigError, lambda: load_model("tiny:llada", dtype=3), "dtype must be a torch.dtype or its name")
    one_line(ConfigError, lambda: load_tokenizer(None), "path must be a checkpoint directory")  # before: hub retries
    assert load_model(Path("tiny:llada")).config.vocab_size == model.config.vocab_size  # a Path is a path


@NO_CUDA
def test_load_model_on_a_cuda_device_object_without_cuda_names_the_python_argument():
    for device in (torch.device("cuda"), 0):  # before: AssertionError / RuntimeError from torch
        message = one_line(ConfigError, lambda device=device: load_model("tiny:llada", device=device),
                           "CUDA is not available", "device='cpu'")
        assert "--device" not in message


def test_trainer_with_a_recipe_path_or_a_dict():
    from dare.trainer import Trainer, run_training

    one_line(ConfigError, lambda: Trainer("recipe.yaml"), "config must be a TrainConfig; got the string 'recipe.yaml'",
             "load_train_config('recipe.yaml')")
    one_line(ConfigError, lambda: run_training("recipe.yaml"), "load_train_config('recipe.yaml')")
    one_line(ConfigError, lambda: Trainer({"model": {"path": "tiny:llada"}}), "got a dict", "load_train_config(")


def test_reward_score_without_lists():
    from dare.rewards import get_reward

    reward = get_reward("gsm8k")
    one_line(InputError, lambda: reward.score(None, None), "completions must be a list of strings; got None")
    one_line(InputError, lambda: reward.score(["2"], {"answer": "2"}), "samples must be a list of mappings; got one "
             "mapping")


# ------------------------------------------------------------------------------------ Python names, not flags

def test_python_callers_read_python_names_not_flags(llada, gsm8k, tmp_path):
    model, tokenizer = llada
    bench, samples = gsm8k
    messages = [
        one_line(ConfigError, lambda: evaluate(model, tokenizer, bench, samples, config=EvalConfig(mode="likelihood")),
                 "EvalConfig.mode 'likelihood' needs a multiple-choice benchmark"),
        one_line(InputError, lambda: evaluate(model, tokenizer, bench, samples, sampler=FOUR,
                                              config=EvalConfig(shots=1), fewshot_pool=[]),
                 "pass fewer shots (EvalConfig.shots) or a larger fewshot_pool"),
        one_line(ConfigError, lambda: EvalConfig(ks=(5,)).check(), "EvalConfig.ks: pass@5 needs"),
    ]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    messages.append(one_line(InputError, lambda: bench.load(str(tmp_path)), "split=NAME"))
    from dare.eval.sweep import run_sweep

    messages.append(one_line(ConfigError, lambda: run_sweep(lambda fields: None, [], tmp_path / "sweep"),
                             "at least one point"))
    assert not [m for m in messages if " --" in m or "-n)" in m], messages
