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


def test_the_cli_starts_without_torch_and_transformers():
    """`dare --help` / `--version` build the parser only: neither torch nor transformers is imported."""
    code = ("import sys, contextlib, io, dare.cli\n"
            "for flags in (['--help'], ['--version'], ['train', '--help']):\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        dare.cli.main(flags)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_lazy_public_api_and_auto_class_registration():
    """`import dare` is light, yet its public names work and transformers' Auto classes know the families once
    transformers is imported (after dare, or before it)."""
    code = ("import sys, dare\n"
            "assert 'torch' not in sys.modules\n"
            "import transformers\n"
            "from transformers import AutoConfig\n"
            "print(type(AutoConfig.for_model('sdar')).__name__, sorted(dare.FAMILIES) == sorted(dare.models.FAMILIES),\n"
            "      dare.get_family('llada').name, dare.__version__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["SDARConfig", "True", "llada", "0.1.0"]
    before = "import transformers, dare; print(type(transformers.AutoConfig.for_model('Dream')).__name__)"
    proc = subprocess.run([sys.executable, "-c", before], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "DreamConfig", proc.stderr


def test_python_dash_m_dare_is_the_dare_command():
    run = subprocess.run([sys.executable, "-m", "dare", "tiny"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().startswith("error: dare tiny: the following arguments"), run


def test_generate_applies_an_adapter_and_takes_eval_s_no_chat_spelling(tmp_path, capsys):
    import torch
    from peft import LoraConfig, get_peft_model

    from dare.models.loading import load_model
    from dare.models.spec import family_of

    base = tmp_path / "base"
    assert main(["tiny", "--family", "llada", "--out", str(base)]) == 0
    model = load_model(str(base))
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=family_of(model).lora_targets))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 2.0)  # a zero-initialised adapter would change nothing
    peft.save_pretrained(tmp_path / "adapter")
    capsys.readouterr()

    def tokens(*extra):
        assert main(["generate", "--model", str(base), "--prompt", "12+7=", "--gen-length", "16", "--block-length",
                     "16", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["results"][0]["tokens"]

    adapted = tokens("--adapter", str(tmp_path / "adapter"), "--no-chat")
    assert adapted == tokens("--adapter", str(tmp_path / "adapter"), "--no-chat-template")
    assert adapted != tokens("--no-chat")  # the adapter was applied
