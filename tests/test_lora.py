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
