"""Training performance paths: fixed shapes, compiled blocks, injected models, the benchmarks."""

import importlib.util
import json
import sys
import weakref
from pathlib import Path

import pytest
import torch

from dare.data.sft import Example, collate_packed
from dare.errors import ConfigError, InputError
from dare.models import family_of
from dare.models.compile import compile_blocks, is_compiled
from dare.models.loading import unwrap
from dare.models.tiny import tiny_model
from dare.trainer import Trainer, load_train_config
from dare.trainer.optim import build_optimizer

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def small_config(tmp_path, *overrides):
    base = [f"trainer.output_dir={tmp_path}", "trainer.progress=false", "data.num_examples=16", "data.max_length=48",
            "trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.max_steps=2", "data.eos_padding=false"]
    return load_train_config(None, base + list(overrides))


def grads_of(trainer, step=0):
    trainer.optimizer.zero_grad(set_to_none=True)
    metrics = trainer.forward_backward(step)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(metrics["loss"]), grads


def assert_same(a, b, atol=1e-6):
    (la, ga), (lb, gb) = a, b
    assert abs(la - lb) < 1e-6 * max(1.0, abs(la))
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=atol, rtol=1e-5, msg=name)


def test_collate_packed_fixed_length_appends_an_untrained_padding_document():
    exs = [Example((1, 2, 3, 4), 1, 7), Example((5, 6, 7), 2, 9)]
    row = collate_packed(exs, length=12, pad_id=0)
    assert row["input_ids"].shape == (1, 12)
    assert row["cu_seqlens"][0].tolist() == [0, 4, 7, 12]
    assert row["example_index"][0].tolist() == [7] * 4 + [9] * 3 + [-1] * 5
    assert row["maskable"][0].tolist() == [False, True, True, True, False, False, True] + [False] * 5
    assert row["input_ids"][0, 7:].tolist() == [0] * 5
    assert collate_packed(exs, length=7)["cu_seqlens"][0].tolist() == [0, 4, 7]  # exact fit: no padding document
    with pytest.raises(InputError, match="does not fit"):
        collate_packed(exs, length=6)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fixed_length_rows_do_not_change_loss_or_gradients(tmp_path, family):
    common = [f"model.path=tiny:{family}", "data.packing=true", "data.pack_length=64"]
    plain = Trainer(small_config(tmp_path / "a", *common, "data.fixed_shapes=false"))
    fixed = Trainer(small_config(tmp_path / "b", *common, "data.fixed_shapes=true"))
    rows = fixed.source.batch(0)
    assert len(rows) > 1 and all(r["input_ids"].shape == (1, 64) for r in rows)
    assert any(int(r["input_ids"].shape[1]) < 64 for r in plain.source.batch(0))
    assert_same(grads_of(plain), grads_of(fixed))


def test_fixed_shapes_default_follows_the_attention_backend(tmp_path):
    def width(*overrides):
        return small_config(tmp_path, *overrides).fixed_width()

    assert width() is None and width("model.attn_backend=eager") is None  # null = auto: off unless flex
    assert width("model.attn_backend=flex") == 48  # padded rows: data.max_length
    assert width("model.attn_backend=flex", "data.packing=true", "data.pack_length=64") == 64
    assert width("data.packing=true") is None
    assert width("data.fixed_shapes=true", "data.packing=true") == 48  # pack_length defaults to max_length
    assert width("data.fixed_shapes=false", "model.attn_backend=flex") is None


def test_fixed_width_shorter_than_a_row_is_a_config_error(tmp_path):
    from dare.trainer.sources import DatasetSource

    exs = [Example((1, 2, 3, 4), 1, 0), Example((5, 6, 7), 1, 1)]
    options = dict(batch_size=2, micro_batch_size=2, eos_id=8, pad_id=9)
    assert DatasetSource(exs, fixed_width=6, **options).batch(0)[0]["input_ids"].shape == (2, 6)
    with pytest.raises(ConfigError, match="fixed_width=3"):
        DatasetSource(exs, fixed_width=3, **options)
    with pytest.raises(ConfigError, match="fixed_width=6"):
        DatasetSource(exs, fixed_width=6, packing=True, pack_length=8, **options)


def test_injected_model_is_trained_as_is(tmp_path):
    model = tiny_model("dream", seed=3).train()
    trainer = Trainer(small_config(tmp_path, "model.path=tiny:llada"), model=model)
    assert trainer.model is model and family_of(trainer.model).name == "dream"
    before = model.lm_head.weight.detach().clone()
    trainer.train_step(0)
    assert not torch.equal(before, model.lm_head.weight)


def test_compiled_blocks_give_the_same_loss_and_gradients(tmp_path):
    common = ["model.path=tiny:llada", "data.packing=true", "data.pack_length=64"]
    plain = Trainer(small_config(tmp_path / "a", *common))
    compiled = Trainer(small_config(tmp_path / "b", *common, "model.compile=true", "model.compile_backend=aot_eager"))
    assert compiled.source.fixed_width is None  # dynamic shapes: rows of any length
    assert len({int(mb["input_ids"].shape[1]) for mb in compiled.source.batch(0)}) > 1
    assert all(is_compiled(b) for b in unwrap(compiled.model).blocks)
    assert not any(is_compiled(b) for b in unwrap(plain.model).blocks)
    assert_same(grads_of(plain), grads_of(compiled), atol=1e-5)
    names = {n for n, _ in compiled.model.named_parameters()}
    assert names == {n for n, _ in plain.model.named_parameters()}  # checkpoints keep their keys


def test_all_blocks_and_lengths_share_one_compiled_graph():
    """Specialised layer indices would compile every block separately (past 8, the rest silently run eagerly)."""
    from torch._dynamo.utils import counters

    def graphs(layers):
        torch._dynamo.reset()
        counters.clear()
        model = compile_blocks(tiny_model("llada", seed=0, n_layers=layers).train(), backend="eager")
        for length in (24, 19):
            ids = torch.randint(0, 250, (1, length))
            model(ids, cu_seqlens=torch.tensor([0, 10, length])).logits.sum().backward()
        return counters["stats"]["unique_graphs"]

    try:
        assert graphs(1) == graphs(4)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("family,sampler,cache", [("llada", "fastdllm", "dual"), ("sdar", "sdar", "block")])
def test_static_compilation_shares_one_graph_per_shape_across_blocks(family, sampler, cache, monkeypatch):
    """dynamic=False: one graph per step shape for all blocks (a block must not read its layer index in compiled
    code), and every block still reads and writes its own cache entry (same tokens as uncompiled decoding) -
    also when each block is handed its own cache layer and writes it in compiled code (DARE_FUSE_CACHE_WRITES),
    with no more graphs: a step's first run and its recording must not compile different variants."""
    from torch._dynamo.utils import counters

    from dare.rollout import SamplerConfig, generate

    extra = {"steps": 16} if family == "llada" else {}
    config = SamplerConfig(sampler=sampler, cache=cache, gen_length=16, block_length=4, engine="static",
                           eos_early_stop=False, **extra)
    prompts = torch.randint(5, 50, (2, 6), generator=torch.Generator().manual_seed(0))

    def decode(layers, compiled):
        torch._dynamo.reset()
        counters.clear()
        model = tiny_model(family, seed=0, n_layers=layers).eval()
        if compiled:
            compile_blocks(model, backend="eager", dynamic=False)
        with torch.no_grad():
            tokens = generate(model, prompts, None, config).completion
        return tokens, counters["stats"]["unique_graphs"]

    try:
        counts = {}
        for switch in ("0", "1"):
            monkeypatch.setenv("DARE_FUSE_CACHE_WRITES", switch)
            tokens, graphs = decode(4, compiled=True)
            assert graphs > 0
            assert decode(2, compiled=True)[1] == graphs  # the last block, kept rows only on some steps, adds its own
            assert torch.equal(tokens, decode(4, compiled=False)[0])
            counts[switch] = graphs
        assert counts["1"] == counts["0"]
    finally:
        torch._dynamo.reset()


def _recording_backend(seen):
    """A dynamo backend that runs the captured graph as it is and records whether any input was symbolic."""

    def backend(graph_module, example_inputs):
        symbolic = any(isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and
                       any(isinstance(s, torch.SymInt) for s in v.shape) for v in example_inputs)
        seen.append(symbolic)
        return graph_module.forward

    return backend


@pytest.mark.parametrize("switch", ["1", "0"])
def test_rollout_engine_decodes_dynamically_compiled_blocks_with_a_static_compilation(switch, monkeypatch):
    """A model compiled for training (dynamic shapes) decodes, in the static engine, through a second compilation of
    each block with static shapes (DARE_STATIC_COMPILE=0: through the dynamic one): same tokens as uncompiled
    decoding, and training forwards afterwards use the dynamic compilation again."""
    from dare.models import compile as compile_module
    from dare.models.compile import COMPILATION
    from dare.rollout import SamplerConfig, generate

    monkeypatch.setenv("DARE_STATIC_COMPILE", switch)
    monkeypatch.setattr(compile_module, "_STATIC_SEEN", weakref.WeakKeyDictionary())  # no shape counted yet
    config = SamplerConfig(sampler="fastdllm", cache="prefix", gen_length=16, block_length=4, steps=16,
                           engine="static", eos_early_stop=False)
    prompts = torch.randint(5, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = generate(tiny_model("llada", seed=0).eval(), prompts, None, config).completion
    torch._dynamo.reset()
    try:
        model = compile_blocks(tiny_model("llada", seed=0), backend="eager")
        dynamic_calls = [block._compiled_call_impl for block in model.blocks]
        static_graphs = []
        for block in model.blocks:  # the static compilation gets a backend that records its graphs' inputs
            block.__dict__[COMPILATION].backend = _recording_backend(static_graphs)
        with torch.no_grad():
            tokens = generate(model.eval(), prompts, None, config).completion
        assert torch.equal(tokens, reference)
        if switch == "1":  # prefix-cache steps of several widths: more than one graph, none with symbolic shapes
            assert len(static_graphs) > 1 and not any(static_graphs)
        else:
            assert static_graphs == []
        assert [block._compiled_call_impl for block in model.blocks] == dynamic_calls
        graphs = len(static_graphs)
        model.train()(torch.randint(0, 250, (2, 21))).logits.sum().backward()
        assert len(static_graphs) == graphs
    finally:
        torch._dynamo.reset()


def test_static_compilation_serves_a_bounded_number_of_shapes_then_the_dynamic_one(monkeypatch, caplog):
    """Past STATIC_SHAPES block input shapes per block class, blocks run their dynamic compilation (dynamo would run a
    frame past its recompile limit eagerly, silently): one note, fewer static graphs, the same tokens."""
    from dare.models import compile as compile_module
    from dare.models.compile import COMPILATION
    from dare.rollout import SamplerConfig, generate

    config = SamplerConfig(sampler="fastdllm", cache="prefix", gen_length=16, block_length=4, steps=16,
                           engine="static", eos_early_stop=False)
    prompts = torch.randint(5, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = generate(tiny_model("llada", seed=0).eval(), prompts, None, config).completion

    def static_graphs(limit):
        monkeypatch.setattr(compile_module, "STATIC_SHAPES", limit)
        monkeypatch.setattr(compile_module, "_STATIC_SEEN", weakref.WeakKeyDictionary())  # shapes of no graph yet
        torch._dynamo.reset()
        caplog.clear()
        model = compile_blocks(tiny_model("llada", seed=0), backend="eager").eval()
        graphs = []
        for block in model.blocks:
            block.__dict__[COMPILATION].backend = _recording_backend(graphs)
        with caplog.at_level("WARNING", logger="dare.models"), torch.no_grad():
            for _ in range(2):
                assert torch.equal(generate(model, prompts, None, config).completion, reference)
        return len(graphs), caplog.text.count("later ones use the dynamic compilation")

    try:
        every, notes = static_graphs(32)  # prefix-cache steps of 4 widths, with and without the kept rows
        assert notes == 0
        bounded, notes = static_graphs(2)
        assert 0 < bounded < every and notes == 1
    finally:
        torch._dynamo.reset()


def test_compile_like_compiles_a_decoding_copy_as_the_model_is_compiled():
    from dare.models.compile import compilation_of, compile_like

    source, copy, plain = tiny_model("llada"), tiny_model("llada"), tiny_model("llada")
    compile_like(copy, source)  # an uncompiled model: nothing to follow
    assert not any(is_compiled(b) for b in copy.blocks)
    compile_blocks(source, backend="aot_eager")
    compile_like(copy, source)
    assert all(compilation_of(b).backend == "aot_eager" and compilation_of(b).dynamic is True for b in copy.blocks)
    assert not any(is_compiled(b) for b in plain.blocks)
    ids = torch.randint(0, 250, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(copy(ids).logits, plain(ids).logits)
    torch._dynamo.reset()


def test_static_shapes_restores_the_blocks_after_an_error_and_models_still_copy_and_save():
    """The blocks get their dynamic call back when the decode inside raises; a model whose blocks made their static
    compilation still deep-copies (the copy makes its own) and saves whole (a compiled function cannot be pickled)."""
    import copy
    import io

    from dare.models.compile import COMPILATION, compilation_of, static_shapes

    model = compile_blocks(tiny_model("llada", seed=0), backend="eager").eval()
    dynamic_calls = [block._compiled_call_impl for block in model.blocks]
    ids = torch.randint(0, 250, (1, 9))
    try:
        with pytest.raises(RuntimeError, match="decode failed"), static_shapes(model), torch.no_grad():
            assert all(call is not dynamic for call, dynamic in
                       zip((b._compiled_call_impl for b in model.blocks), dynamic_calls))
            model(ids)
            raise RuntimeError("decode failed")
        assert [block._compiled_call_impl for block in model.blocks] == dynamic_calls
        assert all(compilation_of(b).static_call is not None for b in model.blocks)
        twin = copy.deepcopy(model)
        assert all(b.__dict__[COMPILATION].static_call is None for b in twin.blocks)
        torch.save(model, io.BytesIO())
    finally:
        torch._dynamo.reset()


def test_compile_and_chunk_options_are_validated(tmp_path):
    with pytest.raises(ConfigError, match="compile_backend"):
        small_config(tmp_path, "model.compile_backend=inductr")
    with pytest.raises(ConfigError, match="logits_chunk_size"):
        small_config(tmp_path, "model.logits_chunk_size=-1")
    with pytest.raises(ConfigError, match="unknown compile backend"):
        compile_blocks(tiny_model("llada"), backend="nope")
    with pytest.raises(ConfigError, match="unknown compile mode"):  # its own CUDA graphs would nest in the engine's
        compile_blocks(tiny_model("llada"), mode="reduce-overhead")
    with pytest.raises(ConfigError, match="needs the inductor backend"):
        compile_blocks(tiny_model("llada"), backend="eager", mode="max-autotune-no-cudagraphs")


def test_compile_modes_reach_every_block_as_inductor_options(monkeypatch):
    import torch._inductor

    from dare.models.compile import COMPILE_MODES

    assert COMPILE_MODES["max-autotune-no-cudagraphs"] == torch._inductor.list_mode_options()["max-autotune-no-cudagraphs"]
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: seen.append(kwargs))
    model = tiny_model("llada")
    compile_blocks(model, mode="max-autotune-tma")
    assert len(seen) == len(model.blocks)
    assert all(k["options"]["triton.enable_persistent_tma_matmul"] and k["options"]["max_autotune"] for k in seen)
    seen.clear()
    compile_blocks(model)
    assert [k["options"] for k in seen] == [None] * len(model.blocks)


def test_compile_blocks_is_exported_where_the_readme_calls_it():
    import dare.models

    assert dare.models.compile_blocks is compile_blocks  # README: dare.models.compile_blocks(model)


def test_every_compile_mode_names_real_inductor_options():
    import torch._inductor.config as inductor

    from dare.models.compile import COMPILE_MODES

    for mode, options in COMPILE_MODES.items():
        for key, value in options.items():
            owner = inductor
            *path, name = key.split(".")
            for part in path:
                owner = getattr(owner, part)
            assert hasattr(owner, name), f"compile mode {mode}: torch has no inductor option {key}"
            assert type(getattr(owner, name)) is type(value), (mode, key)


def test_cpu_optimizer_is_not_fused():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], load_train_config(None, []).optim)
    assert not opt.param_groups[0]["fused"]


def load_benchmark(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_train_benchmark_tiny_runs_every_cpu_path_on_one_objective(tmp_path):
    out = tmp_path / "train.json"
    report = load_benchmark("train").main(["--tiny", "--steps", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    rows = {r["name"]: r for r in report["variants"]}
    assert rows["packed-flex"]["status"] == "skipped" and "CPU" in rows["packed-flex"]["note"]
    assert rows["packed-varlen"]["status"] == "skipped" and "CUDA" in rows["packed-varlen"]["note"]
    ok = [r for r in rows.values() if r["status"] == "ok"]
    assert {r["name"] for r in ok} == {"padded-eager", "padded-sdpa", "packed-sdpa", "packed-sdpa+fullce",
                                       "packed-sdpa+compile"}
    losses = [r["losses"][0] for r in ok]  # same weights, examples and corruption: one objective
    assert max(losses) - min(losses) < 1e-4 * abs(losses[0])
    assert rows["padded-eager"]["padding_fraction"] > 0 and rows["packed-sdpa"]["padding_fraction"] == 0
    assert rows["packed-sdpa+compile"]["padding_fraction"] == 0
    for r in ok:
        assert r["step_s"] > 0 and r["tokens_per_s"] == pytest.approx(report["workload"]["tokens"] / r["step_s"], rel=1e-3)
        assert 0 < r["mfu"] and r["speedup"] > 0
    assert report["step_flops"] > 6 * report["shape"]["matmul_params"] * report["workload"]["tokens"]


def test_train_benchmark_flop_formula_by_hand():
    bench = load_benchmark("train")
    shape = bench.Shape(d_model=8, n_heads=2, n_layers=3, mlp=16, vocab=10, mask_id=9, eos_id=8, pad_id=7)
    per_block = 4 * 8 * 8 + 3 * 8 * 16
    assert shape.matmul_params == 3 * per_block + 8 * 10
    assert shape.step_flops([2, 3]) == 6 * shape.matmul_params * 5 + 12 * 3 * 8 * (4 + 9)


def test_host_overhead_benchmark_tiny(tmp_path):
    out = tmp_path / "host.json"
    report = load_benchmark("host_overhead").main(["--tiny", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["rows"] and all(r["ms"] >= 0 for r in report["rows"])
    assert {r["stage"] for r in report["rows"]} >= {"collate", "corrupt", "totals", "weights"}
