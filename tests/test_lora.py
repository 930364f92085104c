"""LoRA: train -> save adapter -> load adapter -> merge to a full checkpoint, identical logits throughout."""

import json
import subprocess
import sys

import torch
from transformers import AutoModel

from dare.models.loading import load_model
from dare.trainer import Trainer, load_train_config


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
