"""Helpers shared by the benchmark scripts: LLaDA-8B-, Dream-7B- and SDAR-8B-shaped random models built on the device,
device synchronisation, and the visible confidence injection that lets threshold decoding run on random weights.

Import from a script in this directory (``benchmarks/`` is put on ``sys.path`` by the scripts)::

    from common import LLADA_8B, ConfidenceInjection, build_llada, build_sdar, sync, weights_floor
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch

LLADA_8B = dict(d_model=4096, n_heads=32, n_kv_heads=32, n_layers=32, mlp_hidden_size=12288, vocab_size=126464,
                embedding_size=126464, max_sequence_length=4096, mask_token_id=126336, eos_token_id=126081,
                pad_token_id=126081)
"""LLaDA-8B's architecture and special ids (GSAI-ML/LLaDA-8B-Instruct config.json)."""


SDAR_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
               max_window_layers=36, tie_word_embeddings=False, mask_token_id=151669, eos_token_id=151643,
               pad_token_id=151643, bos_token_id=None)
"""SDAR-8B's architecture and special ids (JetLM/SDAR-8B-Chat config.json)."""


DREAM_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072, rope_theta=1000000.0,
                max_window_layers=28, tie_word_embeddings=False, mask_token_id=151666, eos_token_id=151643,
                pad_token_id=151643, bos_token_id=151643)
"""Dream-7B's architecture and special ids (Dream-org/Dream-v0-Instruct-7B config.json; docs/models.md 4.1)."""


def random_on_device(model_class, config, device: torch.device, dtype: torch.dtype, seed: int, is_norm):
    """``model_class(config)`` with random N(0, 0.02) weights (weights whose name satisfies ``is_norm``: 1)
    created directly on ``device``: meta init, ``to_empty``, ``normal_`` - seconds on a GPU, no host copy of the
    weights. Returned in eval mode."""
    with torch.device("meta"):
        model = model_class(config)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_norm(name):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def build_llada(device: torch.device, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides):
    """An LLaDA-8B-shaped model (``overrides`` change fields of :data:`LLADA_8B`, e.g. ``n_layers=16``) with
    random weights created on ``device`` (:func:`random_on_device`)."""
    import dare  # noqa: F401  (registers the families)
    from dare.models.llada import LLaDAConfig, LLaDAModelLM, tiny_llada_config

    raw = tiny_llada_config(**{**LLADA_8B, **overrides})
    raw.pop("model_type")
    return random_on_device(LLaDAModelLM, LLaDAConfig.from_dict(raw), device, dtype, seed,
                            lambda name: name.endswith("norm.weight") or ".ln_f." in name)


def build_sdar(device: torch.device, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides):
    """An SDAR-8B-shaped model (``overrides`` change fields of :data:`SDAR_8B`, e.g. ``num_hidden_layers=18``)
    with random weights created on ``device`` (:func:`random_on_device`)."""
    import dare  # noqa: F401  (registers the families)
    from dare.models.sdar import SDARConfig, SDARForCausalLM, tiny_sdar_config

    raw = tiny_sdar_config(**{**SDAR_8B, **overrides})
    raw.pop("model_type")
    return random_on_device(SDARForCausalLM, SDARConfig.from_dict(raw), device, dtype, seed,
                            lambda name: "norm" in name)


def build_dream(device: torch.device, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides):
    """A Dream-7B-shaped model (``overrides`` change fields of :data:`DREAM_7B`) with random weights created on
    ``device`` (:func:`random_on_device`)."""
    import dare  # noqa: F401  (registers the families)
    from dare.models.dream import DreamConfig, DreamModel, tiny_dream_config

    raw = tiny_dream_config(**{**DREAM_7B, **overrides})
    raw.pop("model_type")
    return random_on_device(DreamModel, DreamConfig.from_dict(raw), device, dtype, seed,
                            lambda name: "norm" in name)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` after :func:`sync`."""
    sync(device)
    return time.perf_counter()


def cuda_ms(fn, reps: int = 50, warmup: int = 3) -> float:
    """Milliseconds per call of ``fn`` on the current CUDA stream (launch overhead included: eager calls)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def require_cuda(script: str) -> None:
    """One line and exit status 2 where a GPU-only script runs without CUDA (instead of torch's traceback)."""
    if not torch.cuda.is_available():
        print(f"{script}: error: needs a CUDA GPU (it times GPU kernels); none is available here", file=sys.stderr)
        raise SystemExit(2)


def graph_us(fn, reps: int = 50) -> float:
    """Microseconds per call of ``fn`` replayed ``reps`` times inside one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (5 * reps) * 1000


def head_weight(model) -> torch.Tensor:
    """The LM head's weight (the input embedding's when tied: a model may then report no output embeddings)."""
    head = model.get_output_embeddings()
    return model.get_input_embeddings().weight if head is None else head.weight


def weight_bytes(model) -> int:
    """Bytes of the weights a forward reads in full (the input embedding is only gathered row-wise, unless the LM
    head reads it too: tied weights)."""
    embedding = model.get_input_embeddings().weight
    gathered = None if head_weight(model) is embedding else embedding
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not gathered)


def memory_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    reps = 10
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - start
    del src, dst
    return 2 * nbytes * reps / seconds


def weights_floor(model, device: torch.device, t_start: float) -> tuple[float, int]:
    """Measure the memory bandwidth and the weight bytes one forward reads, print them with the resulting
    weights-only floor per forward and the setup time since ``t_start``; returns ``(bandwidth, weight bytes)``."""
    bandwidth = memory_bandwidth(device, (64 << 20) if device.type == "cpu" else (4 << 30))
    wbytes = weight_bytes(model)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B params, "
          f"{wbytes / 2**30:.2f} GiB read per forward; device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""), flush=True)
    print(f"memory bandwidth {bandwidth / 1e9:.0f} GB/s -> weights floor {wbytes / bandwidth * 1e3:.2f} ms/forward; "
          f"setup {time.perf_counter() - t_start:.1f}s", flush=True)
    return bandwidth, wbytes


class ConfidenceInjection:
    """Raise the top logit by ``margin`` at a random ``fraction`` of the positions of every forward of the
    model's LM head while :attr:`active` (a forward hook; ``fraction <= 0`` installs nothing). The pick is a
    pseudo-random function of the position's top logit, so eager and CUDA-graph rollouts see the same logits.

    Random weights give near-uniform predictions (top probability ~1e-5 over LLaDA's vocabulary), so a
    confidence-threshold decoder would commit one token per forward; a boosted position gets probability ~1
    and passes any threshold. Benchmarks print the resulting tokens per forward.
    """

    def __init__(self, model, fraction: float, device: torch.device, margin: float = 20.0, seed: int = 1234,
                 active: bool = True):
        self.fraction, self.margin, self.active, self.seed = fraction, margin, active, float(seed)
        self.handle = None
        if fraction > 0:
            self.handle = model.get_output_embeddings().register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        if not self.active:
            return None
        # a deterministic function of each position's own top logit (no random generator): the same logits get
        # the same boost in every engine, and the hook can be recorded into a CUDA graph
        top = output.max(-1).values.float()
        pick = (torch.sin(top * 12345.678 + self.seed) + 1) / 2 < self.fraction
        boost = pick[..., None].to(output.dtype) * self.margin
        return output.scatter_add_(-1, output.argmax(-1, keepdim=True), boost)

    @contextlib.contextmanager
    def enabled(self):
        """Inject only inside the block (e.g. during rollouts, not during training forwards)."""
        previous, self.active = self.active, True
        try:
            yield self
        finally:
            self.active = previous

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


# ---------------------------------------------------------------------------------------------------
# engine records: eager vs graph rollouts, with their floor and roofline fractions
# ---------------------------------------------------------------------------------------------------


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, iters: int, rounds: int = 5) -> float:
    """Measured dense matmul rate (FLOP/s) of ``[n, n] @ [n, n]`` in ``dtype``: the best of ``rounds`` timings of
    ``iters`` calls (CUDA events on GPU). One timing varied by ~5 % between H200 calls (774-810 TFLOP/s), and a
    low peak flatters every roofline fraction; the best round is the stable, conservative denominator."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(rounds):
        if device.type == "cuda":
            seconds = cuda_ms(lambda: a @ b, reps=iters, warmup=0) * iters / 1e3
        else:
            begin = time.perf_counter()
            for _ in range(iters):
                a @ b
            seconds = time.perf_counter() - begin
        best = min(best, seconds)
    return 2.0 * n ** 3 * iters / best


# ---- one variant --------------------------------------------------------------------------------------


class ForwardShapes:
    """Records the ``(batch, query length)`` of every model forward (a hook on the input embedding)."""

    def __init__(self, model):
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.get_input_embeddings().register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        self.shapes.append(tuple(inputs[0].shape))

    def remove(self) -> None:
        self.handle.remove()


class Roofline:
    """Lower bounds of a rollout's forwards on one device.

    * weights floor: every forward reads the weights once (``weight_bytes / bandwidth``);
    * roofline: per forward ``max((weights + KV read) / bandwidth, 2 x (body params x query tokens + LM-head params
      x logit rows) / peak)``, with the KV read of an ideal cache: ``batch x attended keys x kv_bytes_per_token``
      (0 without a cache). The LM head is counted only for the rows whose logits a step reads (the block's): a
      decoder needs no logits of the other rows, and the static engine computes none.
    """

    def __init__(self, model, bandwidth: float, peak_flops: float, element_size: int | None = None):
        """``element_size``: bytes per weight and per cached key / value element when the decode reads another
        dtype than the model's parameters (fp32 master weights decoded from bf16 copies under autocast)."""
        self.bandwidth, self.peak = bandwidth, peak_flops
        embedding = model.get_input_embeddings().weight
        scale = element_size / embedding.element_size() if element_size else 1
        self.weight_bytes = int(weight_bytes(model) * scale)
        head = head_weight(model)
        self.head_params = head.numel()
        self.body_params = sum(p.numel() for p in model.parameters()
                               if p.ndim == 2 and p is not embedding and p is not head)
        config = model.config
        layers = len(model.blocks)
        kv_heads = getattr(config, "num_key_value_heads", None) or getattr(config, "n_kv_heads", None) \
            or getattr(config, "num_attention_heads", None) or config.n_heads
        heads = getattr(config, "num_attention_heads", None) or config.n_heads
        hidden = getattr(config, "hidden_size", None) or config.d_model
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        self.kv_bytes_per_token = 2 * layers * kv_heads * head_dim * (element_size or embedding.element_size())

    def weights_floor_s(self, nfe: int) -> float:
        return nfe * self.weight_bytes / self.bandwidth

    def roofline_s(self, forwards: list[tuple[int, int, int, int]]) -> float:
        """``forwards``: ``(batch, query tokens, attended cached keys, logit rows)`` of each forward."""
        total = 0.0
        for batch, query, cached, logit_rows in forwards:
            memory = (self.weight_bytes + batch * cached * self.kv_bytes_per_token) / self.bandwidth
            compute = 2 * batch * (self.body_params * query + self.head_params * logit_rows) / self.peak
            total += max(memory, compute)
        return total


def threshold_setting(decoder: str, threshold: float) -> dict:
    """``{"threshold": threshold}`` when ``decoder`` reads a threshold, else ``{}`` (the sampler warns about a
    setting its decoder ignores)."""
    from dare.rollout.kernels import DECODER_SETTINGS

    return {"threshold": threshold} if decoder in DECODER_SETTINGS["threshold"] else {}


def engine_record(*, family: str, engine: str, sampler: str, cache: str, decoder: str, batch: int, gen_length: int,
                  steps, out, seconds: float, roofline: Roofline, forwards) -> dict:
    """One record of ``benchmarks/results/*rollout_h200.json`` (fields named by the rollout-engine issue, and the
    kernel switches of ``dare.rollout.engine.kernel_settings``)."""
    from dare.rollout.engine import kernel_settings

    decoded = int((out.step_map >= 0).sum())
    floor = roofline.weights_floor_s(out.nfe)
    bound = roofline.roofline_s(forwards) if forwards else None
    return dict(family=family, engine=engine, sampler=sampler, cache=cache, decoder=decoder, batch=batch,
                gen_length=gen_length, steps=steps, tokens=decoded, seconds=seconds, tokens_per_s=decoded / seconds,
                nfe=out.nfe, tokens_per_forward=decoded / batch / max(out.nfe, 1), ms_per_forward=seconds / out.nfe * 1e3,
                floor_fraction=floor / seconds, roofline_fraction=None if bound is None else bound / seconds,
                kernels=kernel_settings())


def print_engine_table(records: list[dict], title: str) -> None:
    """Engines side by side: tokens/s, the first non-eager engine's ratio to eager, weights-floor and roofline
    fractions."""
    if not records:
        return
    key = lambda r: (r["batch"], r["gen_length"], r["sampler"], r["cache"], r["decoder"])  # noqa: E731
    shapes = sorted({key(r) for r in records}, key=str)
    engines = sorted({r["engine"] for r in records})
    by = {(key(r), r["engine"]): r for r in records}
    print(f"\n{title}")
    compared = next((e for e in engines if e != "eager"), "-")  # the ratio column: first engine against eager
    print("| B | G | sampler | cache | decoder | TPF | " + " | ".join(
        f"{e} tok/s (ms/fwd) [floor, roofline]" for e in engines) + f" | {compared} / eager |")
    print("|---|---|---|---|---|---|" + "---|" * len(engines) + "---|")
    for shape in shapes:
        cells, first = [], None
        for engine in engines:
            r = by.get((shape, engine))
            if r is None:
                cells.append("-")
                continue
            first = first or r
            roof = "-" if r["roofline_fraction"] is None else f"{100 * r['roofline_fraction']:.0f}%"
            cells.append(f"{r['tokens_per_s']:.0f} ({r['ms_per_forward']:.2f}) "
                         f"[{100 * r['floor_fraction']:.0f}%, {roof}]")
        eager = by.get((shape, "eager"))
        fast = by.get((shape, compared))
        ratio = f"{fast['tokens_per_s'] / eager['tokens_per_s']:.2f}x" if eager and fast else "-"
        b, g, sampler, cache, decoder = shape
        print(f"| {b} | {g} | {sampler} | {cache} | {decoder} | {first['tokens_per_forward']:.2f} | "
              + " | ".join(cells) + f" | {ratio} |")


def add_engine_arguments(p) -> None:
    """The rollout benchmarks' engine options: ``--engines``, ``--records``, ``--compile-blocks``."""
    p.add_argument("--engines", nargs="+", help="rollout engines side by side (default: eager graph on CUDA, eager "
                   "static on CPU)")
    p.add_argument("--records", help="write the engine records ({'records': [...]}) to this file")
    p.add_argument("--compile-blocks", nargs="?", const="dynamic", choices=["dynamic", "static"],
                   help="regional torch.compile of every block (dare.models.compile_blocks) before decoding, with "
                        "dynamic shapes (the default) or one static graph per step shape (faster kernels, longer "
                        "warm-up); engine records are labelled '<engine>+compile' / '<engine>+compile-static'")
    p.add_argument("--switch", metavar="NAME=V1,V2",
                   help="time every non-eager engine under each value of one DARE_* environment switch, side by side "
                        "in this process (its steps recorded again per value), e.g. DARE_FUSE_CACHE_WRITES=0,1; "
                        "records are labelled '<engine>[NAME=value]'")
    from dare.rollout.config import WEIGHTS

    p.add_argument("--weights", nargs="+", default=["model"], choices=WEIGHTS,
                   help="SamplerConfig.weights of the non-eager engines, each timed side by side (default: model); "
                        "records of other values are labelled '<engine>[<value>]' and carry token_agreement, the "
                        "fraction of completion tokens equal to the eager run's")
    p.add_argument("--cutlass-narrow", action="store_true",
                   help="route the attention-output and MLP-down projections at 193-256 rows through the CUTLASS "
                        "ping-pong kernel of benchmarks/cutlass (cutlass_gemm.py; build.sh first); every engine's run, the "
                        "eager baseline too, then uses it, and the non-eager labels get '+cutlass'")
    from dare.models.compile import COMPILE_MODES

    p.add_argument("--compile-mode", default="default", choices=sorted(COMPILE_MODES),
                   help="torch.compile mode of --compile-blocks (dare.models.compile.COMPILE_MODES; max-autotune: matmul "
                        "kernels benchmarked per shape, records get '+autotune', or '+autotune-tma' with the persistent "
                        "TMA template; other modes '+<mode>')")


def check_engine_arguments(p, args) -> None:
    """One-line errors for engine options that would otherwise be ignored, and ``--switch`` parsed into
    ``(name, values)`` (None without it)."""
    if args.compile_mode != "default" and not args.compile_blocks:
        p.error("--compile-mode applies to compiled blocks: add --compile-blocks [dynamic|static]")
    if args.switch is not None:
        name, _, values = args.switch.partition("=")
        values = [v for v in values.split(",") if v]
        if not name.startswith("DARE_") or not values:
            p.error(f"--switch takes NAME=V1,V2 with a DARE_* environment variable, got {args.switch!r}")
        if not [e for e in args.engines if e != "eager"]:
            p.error("--switch varies the static/graph engines' kernels: add --engines static or graph")
        args.switch = (name, values)
    if args.weights != ["model"] and not [e for e in args.engines if e != "eager"]:
        p.error("--weights applies to the static/graph engines: add --engines static or graph")
    if args.cutlass_narrow:
        from cutlass_gemm import missing_library

        if error := missing_library("--cutlass-narrow"):
            p.error(error)
    if "graph" in args.engines and not args.device.startswith("cuda"):
        p.error(f"the graph engine records CUDA graphs; on {args.device} compare eager with static (--engines eager static)")


def default_engines(device: str) -> list[str]:
    """``--engines`` default: eager vs graph on CUDA, eager vs static elsewhere."""
    return ["eager", "graph"] if device.startswith("cuda") else ["eager", "static"]


def apply_compile(model, args) -> None:
    """``--cutlass-narrow``: route the narrow projections through CUTLASS; ``--compile-blocks``: compile every block in
    place (the engines then run, and record, compiled blocks)."""
    if args.cutlass_narrow:
        from cutlass_gemm import route_narrow_projections

        print(f"CUTLASS routes {route_narrow_projections(model)} projections at 193-256 rows", flush=True)
    if args.compile_blocks:
        from dare.models.compile import compile_blocks

        compile_blocks(model, dynamic=args.compile_blocks != "static", mode=args.compile_mode)


def warm_seconds(run, args) -> float:
    """Seconds of the budget warm-up ``run()`` (returning its seconds last). With ``--compile-blocks`` the first call
    also compiles, which would inflate the estimate many times over; it is run again and the second call counts."""
    seconds = run()[-1]
    return run()[-1] if args.compile_blocks else seconds


def switch_runs(model, switch):
    """Label suffixes of one engine's runs: ``""`` without ``--switch``; with it, ``"[NAME=value]"`` per value, with
    the variable set and the engine's recorded steps released before each (restored afterwards)."""
    import os

    if switch is None:
        yield ""
        return
    from dare.rollout.engine import release

    name, values = switch
    before = os.environ.get(name)
    try:
        for value in values:
            os.environ[name] = value
            release(model)
            yield f"[{name}={value}]"
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
        release(model)


def time_engines(model, args, run, eager_out, common: dict, label: str) -> list[dict]:
    """Records of every non-eager engine of ``args.engines`` (under each ``--switch`` value and ``--weights`` value):
    ``run(engine, weights)`` decodes once and returns ``(output, seconds)``; the first call records the engine's steps,
    the second is timed. Each record says whether the engine decoded the eager run's tokens and forward count, and
    which fraction of the completion tokens agree with it; one line per run is printed."""
    from dare.rollout.engine import engine_stats

    records = []
    for engine, weights in [(e, w) for e in args.engines if e != "eager" for w in args.weights]:
        for suffix in switch_runs(model, args.switch):  # lazily: each value is set in turn
            suffix += "" if weights == "model" else f"[{weights}]"
            run(engine, weights)  # records the steps
            refreshed = engine_stats(model).copies_refresh_s
            fast, seconds = run(engine, weights)
            refreshed = engine_stats(model).copies_refresh_s - refreshed
            rec = engine_record(engine=engine_label(engine, args) + suffix, out=fast, seconds=seconds, **common)
            rec["weights"] = weights
            rec["copies_refresh_s"] = refreshed  # part of seconds: merged / FP8 copies refreshed (0 for weights=model)
            rec["same_tokens_as_eager"] = bool(torch.equal(fast.completion, eager_out.completion)) and (
                fast.nfe == eager_out.nfe)
            rec["token_agreement"] = float((fast.completion == eager_out.completion).float().mean())
            records.append(rec)
            print(f"run   {label} {rec['tokens_per_s']:9.1f} tok/s  nfe={fast.nfe:<4d} engine={engine}{suffix} "
                  f"{seconds:7.2f}s  floor {100 * rec['floor_fraction']:.0f}%  roofline "
                  f"{100 * rec['roofline_fraction']:.0f}%  same tokens: {rec['same_tokens_as_eager']} "
                  f"(agreement {rec['token_agreement']:.3f}; copies refreshed in {1e3 * refreshed:.1f} ms)", flush=True)
    return records


def engine_label(engine: str, args) -> str:
    label = engine + {None: "", "dynamic": "+compile", "static": "+compile-static"}[args.compile_blocks]
    label += "+cutlass" if args.cutlass_narrow else ""
    if not args.compile_blocks or args.compile_mode == "default":
        return label
    return label + MODE_LABELS.get(args.compile_mode, "+" + args.compile_mode)


MODE_LABELS = {"max-autotune-no-cudagraphs": "+autotune", "max-autotune-tma": "+autotune-tma"}
"""Record-label suffixes of compile modes whose labels predate the mode names (others: ``+<mode>``)."""


def write_engine_records(args, bandwidth: float, wbytes: int, roofline: Roofline, records: list[dict]) -> None:
    """``--records``: the run's settings, bandwidth, weight bytes, peak FLOP/s and every engine record as JSON. Each
    record also carries the run's measured peak and bandwidth (``run_peak_flops``, ``run_bandwidth``), so records
    appended to ``benchmarks/results/*_h200.json`` from several runs keep their own denominators
    (``recompute_roofline.py`` reads them)."""
    if args.records:
        import json
        from pathlib import Path

        records = [{**r, "run_peak_flops": roofline.peak, "run_bandwidth": bandwidth} for r in records]

        Path(args.records).write_text(json.dumps(dict(args=vars(args), bandwidth=bandwidth, weight_bytes=wbytes,
                                                      peak_flops=roofline.peak, records=records), indent=2) + "\n")
