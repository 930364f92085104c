"""The OpenCompass plug-in (``dare.eval.opencompass``) against a tiny model.

With OpenCompass installed the tests use it, and the ``slow`` test runs the whole OpenCompass pipeline on
``configs/opencompass/eval_dare_tiny.py`` (CI does this in a second environment, OpenCompass pins numpy<2: see
``.ci/run``); otherwise they use ``tests/opencompass_stub``, a minimal stand-in of the parts of OpenCompass's
``BaseModel`` interface that the plug-in and the inferencers touch."""

import csv
import importlib
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eval_helpers import train_memorised
from rollout_helpers import single_thread  # noqa: F401  (fixture)

from dare.data.tokenizer import build_byte_tokenizer
from dare.errors import ConfigError, DareError, InputError
from dare.eval.likelihood import LikelihoodConfig, Request, continuation_elbo
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate

STUB = Path(__file__).parent / "opencompass_stub"
HAVE_OPENCOMPASS = importlib.util.find_spec("opencompass") is not None


@pytest.fixture
def oc():
    """``(plug-in module, PromptList)`` with OpenCompass or the stand-in importable."""
    added = False
    if not HAVE_OPENCOMPASS:
        sys.path.insert(0, str(STUB))
        added = True
    sys.modules.pop("dare.eval.opencompass", None)
    try:
        module = importlib.import_module("dare.eval.opencompass")
        from opencompass.utils.prompt import PromptList

        yield module, PromptList
    finally:
        sys.modules.pop("dare.eval.opencompass", None)
        if added:
            sys.path.remove(str(STUB))
            for name in [n for n in sys.modules if n == "opencompass" or n.startswith("opencompass.")]:
                del sys.modules[name]


@pytest.fixture(scope="module")
def tiny():
    """A tiny LLaDA that only writes printable ASCII (so that stop strings can be checked on its text)."""
    model = tiny_model("llada", seed=0).eval()
    allowed = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    allowed[32:127] = True

    def printable(module, inputs, output):
        return output.masked_fill(~allowed.to(output.device), -1e4)

    model.get_output_embeddings().register_forward_hook(printable)
    return model, build_byte_tokenizer()


def test_imports_without_opencompass_and_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opencompass", None)  # `import opencompass...` now fails
    monkeypatch.delitem(sys.modules, "dare.eval.opencompass", raising=False)
    module = importlib.import_module("dare.eval.opencompass")
    try:
        with pytest.raises(ConfigError) as err:
            module.DareDiffusionModel(path="tiny:llada")
    finally:
        sys.modules.pop("dare.eval.opencompass", None)
    message = str(err.value)
    assert message.startswith("the OpenCompass plug-in needs opencompass") and "dare-dllm[opencompass]" in message
    assert "\n" not in message


def test_is_an_opencompass_model_and_registered(oc, tiny):
    module, _ = oc
    from opencompass.models.base import BaseModel
    from opencompass.registry import MODELS

    model = MODELS.build(dict(type="DareDiffusionModel", path="tiny:llada", model=tiny[0], tokenizer=tiny[1]))
    assert isinstance(model, BaseModel) and isinstance(model, module.DareDiffusionModel)
    assert model.get_token_len("abc") == len(tiny[1]("abc")["input_ids"])
    with pytest.raises(ConfigError, match="unknown sampler option 'temprature'"):
        module.DareDiffusionModel(path="tiny:llada", model=tiny[0], tokenizer=tiny[1], sampler={"temprature": 1})


def test_loading_errors_are_one_line(oc, tmp_path):
    module, _ = oc
    with pytest.raises(DareError) as err:
        module.DareDiffusionModel(path=str(tmp_path / "missing"))
    assert str(err.value).endswith("missing: no such checkpoint directory") and "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        module.DareDiffusionModel(path=str(tmp_path), tokenizer_only=True)
    assert str(err.value).startswith("cannot load the tokenizer of") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown likelihood option 'mc_sample'"):
        module.DareDiffusionModel(path="tiny:llada", likelihood={"mc_sample": 2})
    # OpenCompass hands every key of the model entry to the constructor: a misspelt one is not ignored
    with pytest.raises(ConfigError, match=r"unknown argument 'smapler' \(did you mean 'sampler'\?\)"):
        module.DareDiffusionModel(path="tiny:llada", smapler={"sampler": "fastdllm"})
    with pytest.raises(ConfigError, match="unknown sampler 'fastdlm'"):
        module.DareDiffusionModel(path="tiny:llada", sampler={"sampler": "fastdlm"})
    with pytest.raises(ConfigError, match="compile_blocks must be true or false"):
        module.DareDiffusionModel(path="tiny:llada", compile_blocks="maybe")


def test_a_misspelt_kernel_switch_fails_when_the_model_is_made(oc, monkeypatch):
    module, _ = oc
    monkeypatch.setenv("DARE_DECODE_ATTENTION", "flash")
    with pytest.raises(ConfigError, match="DARE_DECODE_ATTENTION must be one of auto, triton, sdpa"):
        module.DareDiffusionModel(path="tiny:llada")


def test_compile_blocks_argument_compiles_every_block(oc, compiled_models):
    from dare.models.compile import is_compiled

    module, _ = oc
    assert all(is_compiled(b) for b in module.DareDiffusionModel(path="tiny:llada", compile_blocks=True).model.blocks)
    assert not any(is_compiled(b) for b in module.DareDiffusionModel(path="tiny:llada").model.blocks)


def test_generate_matches_dare_rollout_and_cuts_stop_words(oc, tiny):
    module, PromptList = oc
    model, tok = tiny
    oc_model = module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok, chat=False,
                                         sampler=dict(sampler="fastdllm", threshold=0.5))
    prompts = ["What is 2+2?", "Name a colour:"]
    texts = oc_model.generate(prompts, max_out_len=12)
    config = SamplerConfig(sampler="fastdllm", threshold=0.5, gen_length=12)  # 12 < 32: one block of 12
    assert oc_model.sampler_config(12).gen_length == 12 and oc_model.sampler_config(40).gen_length == 64
    out = generate(model, [tok(p)["input_ids"] for p in prompts], config=config, example_ids=[0, 1])
    expected = [tok.decode(out.completion[i][out.completion_mask[i]].tolist(), skip_special_tokens=True) for i in range(2)]
    assert texts == expected
    # a stop word cuts the text at its first occurrence
    assert all(len(t) == 12 and t.isprintable() for t in texts)
    stop = texts[0][5:7]
    cut = oc_model.generate(prompts[:1], max_out_len=12, stopping_criteria=[stop])
    assert cut[0] == texts[0][:texts[0].find(stop)] and len(cut[0]) <= 5
    # chat models keep the turns of a gen prompt and apply the chat template
    chat = module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok)
    prompt = PromptList([{"section": "round", "pos": "begin"}, {"role": "HUMAN", "prompt": "Hi"},
                         {"role": "BOT", "prompt": ""}, {"section": "round", "pos": "end"}])
    parsed = chat.parse_template([prompt], mode="gen")[0]
    assert [(p["role"], p["prompt"].strip()) for p in parsed] == [("HUMAN", "Hi")]  # OpenCompass appends "\n"
    turns = [{"role": "user", "content": parsed[0]["prompt"]}]
    templated = tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    assert chat._prompt_ids(parsed, 16) == tok(templated, add_special_tokens=False)["input_ids"]
    assert isinstance(chat.parse_template([prompt], mode="ppl")[0], str)  # likelihood inferencers need text
    assert len(chat.generate_from_template([prompt], max_out_len=8)) == 1


def test_likelihood_methods_are_the_mc_elbo(oc, tiny):
    module, _ = oc
    model, tok = tiny
    oc_model = module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok, likelihood={"mc_samples": 3},
                                         seed=5)
    config = LikelihoodConfig(mc_samples=3)
    context = "Q: 2+2? A:"
    inputs = [context + " 4", context + " 5"]
    cut = oc_model.get_token_len(context)
    ppl = oc_model.get_ppl(inputs, mask_length=[cut, cut])
    ids = [tok(text)["input_ids"] for text in inputs]
    terms = continuation_elbo(model, [Request(x[:cut], x[cut:], i) for i, x in enumerate(ids)], config, seed=5)
    assert ppl.tolist() == pytest.approx((-terms.mean(1) / 2).tolist(), rel=1e-6)
    ll = oc_model.get_loglikelihood(inputs, [" 4", " 5"])
    assert ll.tolist() == pytest.approx(terms.mean(1).tolist(), rel=1e-6)
    whole = oc_model.get_ppl(inputs[:1])  # no mask_length: everything after BOS is scored
    assert whole.shape == (1,) and 0 < whole[0] < 20
    # options at the same batch position share corruptions: same-length options differ only by their tokens
    same = oc_model.get_loglikelihood([context + " 4", context + " 4"], [" 4", " 4"])
    assert same[0] != same[1]  # different groups (positions) -> different noise
    again = oc_model.get_loglikelihood([context + " 4"], [" 4"])
    assert again[0] == pytest.approx(ll[0], rel=1e-9)
    with pytest.raises(Exception, match="not in input"):
        oc_model.get_loglikelihood([context], [" 7"])


def test_ppl_ranks_a_memorised_answer_first(oc, tiny):
    """End to end through OpenCompass's entry point: the lowest ELBO-perplexity option is the memorised one."""
    module, _ = oc
    model = tiny_model("llada", seed=3)
    tok = tiny[1]
    train_memorised(model, tok, "Q: 2+2? A:", " 4")
    oc_model = module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok, likelihood={"mc_samples": 2})
    options = [" 7", " 4", " 9"]
    ppl = [oc_model.get_ppl_from_template(["Q: 2+2? A:" + o], mask_length=[oc_model.get_token_len("Q: 2+2? A:")])[0]
           for o in options]
    assert min(range(3), key=ppl.__getitem__) == 1


ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = (ROOT / "configs" / "opencompass" / "eval_dare_tiny.py").read_text()
needs_opencompass = pytest.mark.skipif(not HAVE_OPENCOMPASS,
                                       reason="OpenCompass is not installed (CI runs this in its own environment)")


def run_dare_opencompass(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``dare eval opencompass ARGS`` in a fresh process (OpenCompass's runners start their own)."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dare.cli", "eval", "opencompass", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)


@needs_opencompass
@pytest.mark.parametrize("old, new, expected", [
    ("data/tiny_mcq.jsonl", "data/missing.jsonl",
     "error: OpenCompass dataset configs/opencompass/data/missing.jsonl: no such file (relative paths start at"),
    ("block_length=8", "block_lenght=8",
     "error: OpenCompass model tiny-llada-fastdllm: unknown sampler option 'block_lenght' (did you mean 'block_length'?)"),
    ("block_length=8)", "block_length=8, mc_samples=8)",
     "error: OpenCompass model tiny-llada-fastdllm: 'mc_samples' is not a sampler option; write it as "
     "likelihood=dict(mc_samples=...)"),
    ("max_seq_len=512,", "max_seq_len=512, smapler=None,",
     "error: OpenCompass model tiny-llada-fastdllm: unknown argument 'smapler' (did you mean 'sampler'?)"),
    ('path="tiny:llada"', 'path="./checkpoints/llada"',
     "error: OpenCompass model tiny-llada-fastdllm: model path ./checkpoints/llada: no such checkpoint directory"),
    ("datasets = [", ("from mmengine.config import read_base\nwith read_base():\n"
                      "    from opencompass.configs.datasets.gsm8k.gsm8k_gne import gsm8k_datasets\ndatasets = ["),
     "error: OpenCompass config {config}: no config opencompass.configs.datasets.gsm8k.gsm8k_gne (no file"),
])
def test_dare_eval_opencompass_loading_errors_are_one_line(tmp_path, monkeypatch, capsys, old, new, expected):
    """Caught before OpenCompass starts a task (in this process: only the config is loaded)."""
    from dare.cli import main

    assert old in TINY_CONFIG
    config = tmp_path / "eval_broken.py"
    config.write_text(TINY_CONFIG.replace(old, new))
    monkeypatch.chdir(ROOT)
    assert main(["eval", "opencompass", str(config), "-w", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(expected.format(config=config)) and "Traceback" not in "".join(err), err
    assert not (tmp_path / "out").exists()  # nothing was launched


@needs_opencompass
def test_the_shipped_configs_pass_the_checks(monkeypatch):
    """No false alarms on real OpenCompass dataset entries (typed datasets with dataset ids, read_base imports)."""
    from dare.commands.eval_oc import load_config
    from dare.eval.opencompass_checks import check_config

    monkeypatch.chdir(ROOT)
    for name in ("eval_dare_tiny.py", "eval_dare_llada.py"):
        config = load_config(f"configs/opencompass/{name}")
        assert config["models"] and config["datasets"]
        check_config(config)


@needs_opencompass
def test_dare_eval_opencompass_unknown_dataset_name(tmp_path, monkeypatch, capsys):
    from dare.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "opencompass", "--datasets", "gsm8k_gne", "--models", "hf_llama3_8b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: unknown OpenCompass dataset 'gsm8k_gne' (did you mean 'gsm8k_gen'?)"), err


@pytest.mark.slow
@needs_opencompass
def test_a_task_that_fails_in_opencompass_ends_with_its_error(tmp_path):
    """A mistake only the task subprocess meets (a hub name that cannot be fetched offline): OpenCompass logs
    the traceback and exits 0; ``dare eval opencompass`` ends with the error from the task's log."""
    config = tmp_path / "eval_hub_typo.py"
    config.write_text(TINY_CONFIG.replace('path="tiny:llada"', 'path="nobody/no-such-dllm"'))
    done = run_dare_opencompass(ROOT, str(config), "-w", str(tmp_path / "out"), "--mode", "infer")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert last.startswith("error: OpenCompass task OpenICLInfer[tiny-llada-fastdllm/tiny_mcq") and \
        "failed: model nobody/no-such-dllm: no such local directory, and the hub did not provide it" in last, last
    log = last.rpartition("(log: ")[2].rstrip(")")
    assert Path(log).is_file() and "Traceback" in Path(log).read_text()


@pytest.mark.slow
@needs_opencompass
def test_opencompass_runs_the_tiny_config_end_to_end(tmp_path):
    """``dare eval opencompass configs/opencompass/eval_dare_tiny.py`` (OpenCompass's CLI after the checks) on CPU:
    a likelihood (ppl) and a generation dataset."""
    done = run_dare_opencompass(ROOT, "configs/opencompass/eval_dare_tiny.py", "-w", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = next(tmp_path.rglob("summary_*.csv"))
    rows = list(csv.DictReader(summary.open()))
    assert sorted(r["dataset"] for r in rows) == ["tiny_mcq", "tiny_qa"]
    assert {r["mode"] for r in rows} == {"ppl", "gen"}
    for row in rows:  # a dataset whose inference or scoring failed shows "-" instead of a number
        value = float(row["tiny-llada-fastdllm"])
        assert math.isfinite(value) and 0 <= value <= 100, row


def test_the_imports_argument_brings_a_plugin_sampler_in(oc, tiny, tmp_path, monkeypatch, request):
    """``imports=[...]`` of a model entry: imported when the model is made (in each OpenCompass task's process),
    before its sampler name is checked; a missing file is a one-line error naming the argument."""
    from dare import plugins
    from dare.rollout.registry import SAMPLERS

    module, _ = oc
    model, tok = tiny
    monkeypatch.setattr(plugins, "_LOADED", {})
    request.addfinalizer(lambda: SAMPLERS.pop("llada_blocks4_oc", None))  # the plug-in's sampler leaves with the test
    plugin = tmp_path / "my_sampler_oc.py"
    plugin.write_text('from dare.rollout import Sampler, register_sampler\n\n'
                      'register_sampler(Sampler("llada_blocks4_oc", "llada in blocks of 4", {"block_length": 4}))\n')
    entry = dict(path="tiny:llada", model=model, tokenizer=tok, chat=False, sampler={"sampler": "llada_blocks4_oc"})
    with pytest.raises(ConfigError, match="unknown sampler 'llada_blocks4_oc'"):
        module.DareDiffusionModel(**entry)
    with pytest.raises(ConfigError, match=r"^DareDiffusionModel: imports: no file .*missing\.py"):
        module.DareDiffusionModel(**entry, imports=[str(tmp_path / "missing.py")])
    oc_model = module.DareDiffusionModel(**entry, imports=[str(plugin)])
    assert oc_model.sampler_config(8).block_length == 4
    assert len(oc_model.generate(["What is 2+2?"], max_out_len=8)) == 1


def dare_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dare.eval"]


def test_over_long_inputs_are_cut_from_the_left_with_one_warning(oc, tiny, caplog):
    """Before: prompts past max_seq_len lost their start without a word (``dare eval run`` warns about prompts
    beyond the model's context length)."""
    import logging

    module, _ = oc
    model, tok = tiny
    oc_model = module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok, chat=False, max_seq_len=24,
                                         likelihood={"mc_samples": 1})
    long, short = "Q: " + "a long question " * 3 + "A:", "Q: 2+2? A:"
    assert len(tok(long)["input_ids"]) > 24 - 8 >= len(tok(short)["input_ids"])
    assert oc_model._prompt_ids(long, 8) == tok(long)["input_ids"][-16:]  # cut from the left, as before
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        assert len(oc_model.generate([long, short, short], max_out_len=8)) == 3
        oc_model.generate([long], max_out_len=8)  # once per model
        oc_model.get_loglikelihood([short + " 4"], [" 4"])  # fits: nothing to say
        oc_model.get_loglikelihood([long + " 4", short + " 4"], [" 4", " 4"])
        oc_model.get_ppl([long + " 4"], mask_length=[len(tok(long)["input_ids"])])
    assert dare_warnings(caplog) == [
        "warning: DareDiffusionModel: 1 of 3 generation inputs of this call are longer than max_seq_len 24 - "
        "gen_length 8 = 16 tokens and were cut from the left (their start is not seen); raise max_seq_len to keep "
        "them (later cuts are not reported)",
        "warning: DareDiffusionModel: 1 of 2 likelihood inputs of this call are longer than max_seq_len 24 tokens "
        "(context + scored tokens) and were cut from the left (their start is not seen); raise max_seq_len to keep "
        "them (later cuts are not reported)"]


def test_min_out_len_and_other_generate_arguments_are_warned_about_once(oc, tiny, caplog):
    """Before: ``min_out_len`` (OpenCompass passes the model entry's) and any other keyword argument of
    ``generate`` were dropped without a word; DARE's samplers have no minimum output length."""
    import logging

    module, _ = oc
    model, tok = tiny
    oc_model = module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok, chat=False)
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        oc_model.generate(["Q: 2+2? A:"], max_out_len=8, min_out_len=None)  # OpenCompass's default: nothing to say
        oc_model.generate(["Q: 2+2? A:"], max_out_len=8, min_out_len=4, num_beams=2)
        oc_model.generate(["Q: 2+2? A:"], max_out_len=8, min_out_len=4, num_beams=2)
        oc_model.generate(["Q: 2+2? A:"], max_out_len=8, do_sample=True)
    assert dare_warnings(caplog) == [
        "warning: DareDiffusionModel.generate ignores min_out_len=4, num_beams=2: DARE's samplers have no minimum "
        "output length; decoding settings go in the model entry's sampler=dict(...)",
        "warning: DareDiffusionModel.generate ignores do_sample=True: decoding settings go in the model entry's "
        "sampler=dict(...)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        module.DareDiffusionModel(path="tiny:llada", model=model, tokenizer=tok, chat=False).generate(
            ["Q: 2+2? A:"], max_out_len=8, min_out_len=2)
    assert dare_warnings(caplog) == ["warning: DareDiffusionModel.generate ignores min_out_len=2: DARE's samplers "
                                     "have no minimum output length"]
