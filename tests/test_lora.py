"""LoRA: train -> save adapter -> load adapter -> merge to a full checkpoint, identical logits throughout."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModel

from dare.models.loading import load_model
from dare.trainer import Trainer, load_train_config

ROOT = Path(__file__).resolve().parents[1]


def test_lora_train_save_load_merge_round_trip(tmp_path):
    run = tmp_path / "run"
    config = load_train_config(None, [
        f"trainer.output_dir={run}", "trainer.progress=false", "model.path=tiny:dream:3", "lora.enabled=true",
        "lora.r=4", "data.num_examples=16", "data.max_length=48", "trainer.batch_size=4", "trainer.max_steps=3",
        "optim.lr=1e-2",
    ])
    trainer = Trainer(config)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    ids = torch.randint(0, 256, (2, 12))
    trained = trainer.model.eval()
    with torch.no_grad():
        expected = trained(ids).logits
        assert not torch.allclose(expected, load_model("tiny:dream:3")(ids).logits)  # the adapter changed the model
        adapter = run / "final"
        assert (adapter / "adapter_config.json").is_file()
        assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny:dream:3"
        reloaded = load_model("tiny:dream:3", adapter=str(adapter))
        torch.testing.assert_close(reloaded(ids).logits, expected, atol=0, rtol=0)

    merged = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "dare.cli", "merge-lora", "--adapter", str(adapter), "--out", str(merged)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    model = AutoModel.from_pretrained(str(merged))  # strict loading: no LoRA or missing keys
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert (merged / "tokenizer.json").is_file()


def test_an_adapter_loaded_on_another_base_than_it_records_is_warned(tmp_path, caplog):
    """Before, an adapter trained on one checkpoint loaded silently on any model of the same shapes."""
    from peft import LoraConfig, get_peft_model

    from dare.models.spec import family_of

    base = load_model("tiny:llada:0")
    adapter = tmp_path / "adapter"
    get_peft_model(base, LoraConfig(r=2, target_modules=family_of(base).lora_targets)).save_pretrained(str(adapter))
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny:llada:0"
    caplog.set_level("WARNING", logger="dare.models")
    load_model("tiny:llada", str(adapter))  # the same model (seed 0)
    assert not caplog.records
    load_model("tiny:llada:1", str(adapter))
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: adapter {adapter} was trained on tiny:llada:0; loading it on tiny:llada:1"]


def test_same_model_resolves_tiny_seeds_and_local_paths(tmp_path, monkeypatch):
    from dare.models.loading import same_model

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    assert same_model("ckpt", str(tmp_path / "link")) and same_model("./ckpt/", str(tmp_path / "ckpt"))
    assert same_model("tiny:dream", "tiny:dream:0") and not same_model("tiny:dream", "tiny:llada")
    assert not same_model("ckpt", "tiny:llada") and same_model("org/model", "org/model/")
    assert not same_model("org/model", "org/other")


def test_a_lora_run_resumes_exactly_from_its_trainable_only_checkpoint(tmp_path):
    """A LoRA checkpoint holds only the adapters (and their optimizer state); resuming from it loads them into the
    model whose frozen base weights are not in the file. (It asked for every base weight: a traceback.) The resumed
    run ends where the uninterrupted one does."""
    recipe = ROOT / "configs/llada/sft_lora_tiny.yaml"
    common = ["trainer.progress=false", "trainer.export=false"]
    full = Trainer(load_train_config(recipe, [f"trainer.output_dir={tmp_path / 'a'}", "trainer.max_steps=3",
                                              *common]))
    full.train()
    Trainer(load_train_config(recipe, [f"trainer.output_dir={tmp_path / 'b'}", "trainer.max_steps=2",
                                       *common])).train()
    resumed = Trainer(load_train_config(recipe, [f"trainer.output_dir={tmp_path / 'b'}", "trainer.max_steps=3",
                                                 *common]))
    resumed.train()
    trained = [(n, p) for n, p in full.model.named_parameters() if p.requires_grad]
    assert trained and all("lora" in name for name, _ in trained)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


def lora_run(tmp_path, *overrides: str) -> Path:
    """A 2-step LoRA SFT run on tiny:llada (whose byte tokenizer has a chat template); returns its ``final/``."""
    run = tmp_path / "run"
    Trainer(load_train_config(None, [
        f"trainer.output_dir={run}", "trainer.progress=false", "model.path=tiny:llada", "lora.enabled=true",
        "lora.r=2", "data.num_examples=8", "data.max_length=32", "trainer.batch_size=4", "trainer.max_steps=2",
        *overrides,
    ])).train()
    return run / "final"


def eval_prompt(tmp_path, name: str, *model: str) -> dict:
    """The ``prompt`` settings that ``dare eval run`` records for ``model`` (its flags) on one tiny problem."""
    from dare.cli import main

    out = tmp_path / f"{name}.json"
    assert main(["eval", "run", *model, "--benchmark", "gsm8k", "--data",
                 str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl"), "--limit", "1", "--gen-length", "4",
                 "--out", str(out)]) == 0
    return json.loads(out.read_text())["prompt"]


def test_a_lora_run_trained_without_chat_template_is_evaluated_and_merged_without_one(tmp_path):
    """LoRA training saves the run's tokenizer (without its chat template: ``data.chat_template=false``) next to the
    adapter, as a full fine-tune saves it in final/. ``--adapter`` loading and ``dare merge-lora`` took the base
    model's tokenizer instead, so the run was evaluated with a chat template it never saw."""
    from dare.cli import main
    from dare.eval.run import load_for_eval
    from dare.models.loading import load_tokenizer

    assert load_tokenizer("tiny:llada").chat_template is not None  # the base's would template the prompts
    adapter = lora_run(tmp_path, "data.chat_template=false")
    assert (adapter / "tokenizer_config.json").is_file() and not (adapter / "chat_template.jinja").exists()

    _, tokenizer, info = load_for_eval("tiny:llada", str(adapter), "cpu", None)  # eval run, lm-eval, sweeps
    assert tokenizer.chat_template is None and info["tokenizer"] == str(adapter)
    assert eval_prompt(tmp_path, "adapter", "--model", "tiny:llada", "--adapter", str(adapter))["chat"] is False
    from dare.commands.generate import load_model as load_for_generate

    assert load_for_generate("tiny:llada", "cpu", None, str(adapter))[1].chat_template is None  # dare generate
    _, tokenizer, info = load_for_eval("tiny:llada", str(adapter), "cpu", None, tokenizer="tiny:llada")
    assert tokenizer.chat_template is not None and info["tokenizer"] == "tiny:llada"  # --tokenizer still wins

    merged = tmp_path / "merged"
    assert main(["merge-lora", "--adapter", str(adapter), "--out", str(merged)]) == 0
    assert not (merged / "chat_template.jinja").exists() and load_tokenizer(str(merged)).chat_template is None
    assert eval_prompt(tmp_path, "merged", "--model", str(merged))["chat"] is False
    assert not [p.name for p in tmp_path.glob(".*")]  # no temporary directory left beside the output
    assert main(["merge-lora", "--adapter", str(adapter), "--out", str(merged), "--tokenizer", "tiny:llada"]) == 0
    assert load_tokenizer(str(merged)).chat_template is not None


def test_an_adapter_without_tokenizer_files_loads_the_base_models_tokenizer(tmp_path):
    """An adapter saved without a tokenizer (peft's own save_pretrained, a hub adapter) keeps the base's: the chat
    template of a run trained with one (the default) is applied, and merge-lora writes the base's tokenizer."""
    from peft import LoraConfig, get_peft_model

    from dare.cli import main
    from dare.eval.run import load_for_eval
    from dare.models.loading import load_tokenizer
    from dare.models.spec import family_of

    base = load_model("tiny:llada")
    adapter = tmp_path / "adapter"
    get_peft_model(base, LoraConfig(r=2, target_modules=family_of(base).lora_targets)).save_pretrained(str(adapter))
    assert not (adapter / "tokenizer_config.json").exists()
    _, tokenizer, info = load_for_eval("tiny:llada", str(adapter), "cpu", None)
    assert tokenizer.chat_template is not None and "tokenizer" not in info
    assert eval_prompt(tmp_path, "adapter", "--model", "tiny:llada", "--adapter", str(adapter))["chat"] is True
    merged = tmp_path / "merged"
    assert main(["merge-lora", "--adapter", str(adapter), "--out", str(merged)]) == 0
    assert load_tokenizer(str(merged)).chat_template is not None

    templated = lora_run(tmp_path)  # trained with the chat template: its saved tokenizer keeps it
    _, tokenizer, _ = load_for_eval("tiny:llada", str(templated), "cpu", None)
    assert tokenizer.chat_template == load_tokenizer("tiny:llada").chat_template
