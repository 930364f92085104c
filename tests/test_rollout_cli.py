"""``dare generate`` and the rollout benchmark's CPU smoke mode."""

import importlib.util
import json
from pathlib import Path

import pytest

from rollout_helpers import single_thread  # noqa: F401  (fixture)

from dare.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_generate_tiny_json(capsys):
    code = main(["generate", "--model", "tiny:llada", "--prompt", "Hi", "--prompt", "What is 2+2?",
                 "--sampler", "fastdllm", "--gen-length", "16", "--block-length", "8", "--cache", "dual",
                 "-o", "eos_early_stop=false", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sampler"] == "fastdllm" and result["config"]["cache"] == "dual"
    assert result["config"]["eos_early_stop"] is False
    assert len(result["results"]) == 2 and all(len(r["tokens"]) == 16 for r in result["results"])
    assert 2 <= result["nfe"] <= 16


def test_generate_checkpoint_dir_with_chat_template(tiny_dirs, capsys):
    args = ["generate", "--model", str(tiny_dirs["dream"]), "--prompt", "Hello", "--sampler", "dream",
            "--gen-length", "8", "--steps", "4", "--temperature", "0.5", "--json"]
    assert main(args) == 0
    chat = json.loads(capsys.readouterr().out)
    assert main(args + ["--no-chat-template"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert chat["config"]["schedule"] == "timestep" and chat["nfe"] == 4
    assert chat["results"][0]["steps"] == raw["results"][0]["steps"] == 4
    # <|bos|><|user|>Hello<|eot|><|assistant|> vs the 5 bytes of "Hello"
    assert (chat["results"][0]["prompt_tokens"], raw["results"][0]["prompt_tokens"]) == (9, 5)


def test_generate_errors_are_one_line(tmp_path, capsys):
    cases = ((["--sampler", "fastdlm"], "unknown sampler 'fastdlm' (did you mean 'fastdllm'?)"),
             (["-o", "temprature=1"], "unknown sampler option 'temprature' (did you mean 'temperature'?)"),
             (["--block-length", "5"], "block_length (5) must divide gen_length (128)"),
             (["--model", str(tmp_path / "nope")], "nope: no such checkpoint directory"))
    for extra, message in cases:
        model = [] if "--model" in extra else ["--model", "tiny:llada"]  # an option is given once
        assert main(["generate", *model, "--prompt", "x", *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def load_benchmark():
    spec = importlib.util.spec_from_file_location("rollout_benchmark", ROOT / "benchmarks" / "rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_tiny_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench = load_benchmark()
    assert bench.main(["--tiny", "--batch", "2", "--gen", "16", "--configs", "naive", "dual", "dual+threshold",
                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    runs = {r["config"]: r for r in data["results"]}
    assert set(runs) == {"naive", "dual", "dual+threshold"}
    assert runs["naive"]["nfe"] == runs["dual"]["nfe"] == 16 and runs["naive"]["tokens"] == 32
    assert runs["dual+threshold"]["tokens_per_forward"] >= 1
    assert "| dual+threshold |" in printed and "x naive" in printed


def test_benchmark_dream_shape_records_its_family_preset_and_sampling_settings(tmp_path, capsys, monkeypatch):
    import dare.rollout

    records, decoded = tmp_path / "records.json", []
    generate = dare.rollout.generate

    def spy(model, prompts, mask, config, **kwargs):
        decoded.append((type(model).__name__, config))
        return generate(model, prompts, mask, config, **kwargs)

    monkeypatch.setattr(dare.rollout, "generate", spy)
    bench = load_benchmark()
    assert bench.main(["--tiny", "--family", "dream", "--batch", "2", "--gen", "16", "--configs", "dual",
                       "--confidence", "neg_entropy", "--temperature", "0.7", "--top-p", "0.9",
                       "--records", str(records)]) == 0
    assert "T 0.7 top-p 0.9" in capsys.readouterr().out
    rows = json.loads(records.read_text())["records"]
    assert {r["engine"] for r in rows} == {"eager", "static"}
    for row in rows:
        assert (row["family"], row["sampler"], row["cache"]) == ("dream", "fastdllm_dream", "dual")
        assert (row["confidence"], row["temperature"], row["top_p"]) == ("neg_entropy", 0.7, 0.9)
        assert row["tokens"] == 32 and row["nfe"] == 16
    assert decoded and all(name == "DreamModel" and (c.sampler, c.confidence, c.temperature, c.top_p)
                           == ("fastdllm_dream", "neg_entropy", 0.7, 0.9) for name, c in decoded)


@pytest.mark.parametrize("argv,message", [(["--top-p", "1.5"], "--top-p must lie in (0, 1)"),
                                          (["--temperature", "-1"], "--temperature must be >= 0"),
                                          (["--family", "sdar"], "invalid choice: 'sdar'")])
def test_benchmark_rejects_bad_sampling_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        load_benchmark().parse_args(["--tiny", *argv])
    assert message in capsys.readouterr().err


def test_option_values_parse_like_a_recipe():
    """``-o cache=none`` is the 'none' cache (as ``cache: none`` in YAML), not 'unset': it used to fall back to the
    preset's cache silently. ``null`` unsets a field."""
    from dare.commands.generate import parse_options
    from dare.rollout import SamplerConfig

    values = parse_options(["cache=none", "top_p=null", "threshold=0.5", "eos_early_stop=false"])
    assert values == {"cache": "none", "top_p": None, "threshold": 0.5, "eos_early_stop": False}
    assert SamplerConfig.from_dict({"sampler": "fastdllm", **values}).resolved().cache == "none"


def test_roofline_counts_the_lm_head_only_on_the_rows_whose_logits_are_read():
    import sys


    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import Roofline, head_weight, weight_bytes

    from dare.models.llada import LLaDAConfig, LLaDAModelLM, tiny_llada_config

    for tied in (False, True):
        model = LLaDAModelLM(LLaDAConfig(**tiny_llada_config(weight_tying=tied)))
        head = head_weight(model)
        body = sum(p.numel() for p in model.parameters() if p.ndim == 2) - head.numel() - (
            0 if tied else model.get_input_embeddings().weight.numel())
        roofline = Roofline(model, bandwidth=1e30, peak_flops=1e9)  # compute binds
        assert roofline.head_params == head.numel() and roofline.body_params == body
        expected = 2 * 3 * (body * 40 + head.numel() * 8) / 1e9
        assert abs(roofline.roofline_s([(3, 40, 0, 8)]) - expected) < 1e-12 * expected
        # a tied head reads the embedding matrix in full: it counts towards the weights floor
        embedding_bytes = model.get_input_embeddings().weight.numel() * 4
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        assert weight_bytes(model) == (total if tied else total - embedding_bytes)
        # fp32 master weights decoded from bf16 copies (--fp32-weights --autocast): bf16 bytes, not fp32
        halved = Roofline(model, bandwidth=1.0, peak_flops=1e30, element_size=2)
        assert halved.weight_bytes * 2 == weight_bytes(model)
        assert halved.kv_bytes_per_token * 2 == roofline.kv_bytes_per_token


def test_recomputed_roofline_reproduces_the_recorded_sixth_session_fractions(tmp_path, capsys):
    """``recompute_roofline.py`` (the command RESULTS.md gives for the stricter fractions) gives back the fraction
    the sixth H200 session stored for a record, from its seconds, bandwidth and the session's best peak."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import recompute_roofline

    stored = json.loads((ROOT / "benchmarks" / "results" / "bd_rollout_h200.json").read_text())["records"]
    record = next(r for r in stored if "sixth H200 session (commit f4b4e34" in (r.get("session") or "")
                  and r["batch"] == 64)
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"records": [record]}))
    assert recompute_roofline.main([str(path), "--peak", "810.2221611809887"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split("|")
    assert abs(float(row[8].strip(" %")) - 100 * record["roofline_fraction_head_on_logit_rows"]) < 0.05
