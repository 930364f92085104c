"""The dare CLI: tiny checkpoints load through transformers in a fresh interpreter; errors are one line."""

import json
import subprocess
import sys

import pytest
from conftest import ALL_FAMILIES

from dare.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dare.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_tiny_checkpoint_loads_with_automodel(family, tmp_path):
    out = tmp_path / family
    assert main(["tiny", "--family", family, "--out", str(out)]) == 0
    code = (
        "import dare, transformers; "
        f"m = transformers.AutoModel.from_pretrained({str(out)!r}); "
        f"t = transformers.AutoTokenizer.from_pretrained({str(out)!r}); "
        "print(type(m).__name__, t.mask_token_id, len(t))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    name, mask_id, vocab = proc.stdout.split()[-3:]
    assert name == {
        "llada": "LLaDAModelLM", "dream": "DreamModel", "llada_moe": "LLaDAMoEModelLM", "sdar": "SDARForCausalLM",
        "sdar_moe": "SDARMoeForCausalLM", "llada2": "LLaDA2MoeModelLM",
    }[family]
    assert (int(mask_id), int(vocab)) == (259, 264)
    config = json.loads((out / "config.json").read_text())
    assert config["mask_token_id"] == 259


def test_unknown_family_is_one_line_error(tmp_path):
    proc = run_cli("tiny", "--family", "lladaa", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown model family 'lladaa'" in lines[0] and "did you mean 'llada'" in lines[0]


def test_bad_config_is_one_line_error(tmp_path):
    out = tmp_path / "llada"
    assert main(["tiny", "--family", "llada", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    config["mask_token_id"] = 100000
    (out / "config.json").write_text(json.dumps(config))
    code = f"import dare, transformers; transformers.AutoModel.from_pretrained({str(out)!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "ConfigError: llada: mask_token_id=100000 is outside the vocabulary (size 264)" in proc.stderr
