"""The Triton kernels (token proposals, top-p, split-KV decoding attention) compile for a Hopper GPU (sm_90) without
one: Triton's own front end, its NVIDIA backend and its bundled ``ptxas`` run on the CPU.

Triton's interpreter (the CPU tests of each kernel) accepts programs that the compiler rejects: a loop variable
whose type changes (a scalar reused as a tile) passed every interpreter test of the top-p kernel and failed its
first GPU run. Compiling each kernel for ``sm_90`` here, with the settings the launches use, catches that class of
error before a device call. Skipped where Triton or its NVIDIA backend is not installed (the CPU-only CI).
"""

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

TYPES = {
    # proposal kernel
    "Logits": "*bf16", "stride_b": "i64", "stride_w": "i64", "V": "i32", "banned": "i32", "temperature": "fp32",
    "Partial": "*fp32", "Best": "*i32", "Keys": "*i64", "Counters": "*i64", "Pos": "*i64", "W": "i32",
    "spb": "i64", "spw": "i64", "Eligible": "*u8", "Tokens": "*i64", "Score": "*fp32", "Logprob": "*fp32",
    # top-p kernel
    "stride": "i64", "divisor": "fp32", "top_p": "fp32", "Lse": "*fp32", "Hist": "*fp32", "Prefix": "*i64",
    "Above": "*fp32", "Own": "*i32", "Out": "*fp32", "Drawn": "*fp32", "Scratch": "*i32", "Found": "*i32",
    "Cuts": "*i64",
}
"""The launches' argument types, by parameter name."""


ATTENTION_TYPES = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Mask": "*u8", "Stats": "*fp32", "Out": "*bf16",
                   "HKV": "i32", "GROUPS": "i32", "QLEN": "i32", "KLEN": "i32", "SCALE_LOG2": "fp32"}
"""The split-KV decoding attention's argument types (strides, ``s..``: i32)."""


def compile_for_hopper(kernel, num_warps: int, types: dict | None = None, **constexprs) -> str:
    """PTX of ``kernel`` for sm_90 with ``constexprs``; every other parameter typed by ``types`` (default
    :data:`TYPES`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    types = TYPES if types is None else types
    signature = {p.name: "constexpr" if p.is_constexpr else types[p.name] for p in kernel.params}
    assert set(constexprs) == {name for name, kind in signature.items() if kind == "constexpr"}, kernel
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["ptx"]


@pytest.fixture(scope="module")
def nvidia_backend():
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        try:
            get_ptxas(90)  # Triton >= 3.6 asks for the target architecture
        except TypeError:
            get_ptxas()
    except Exception as error:  # noqa: BLE001 - no NVIDIA backend or no ptxas: nothing to compile with
        pytest.skip(f"Triton's NVIDIA backend is unavailable: {error}")


@pytest.mark.parametrize("bits,step,banned", [(16, 0, "pair"), (16, 3, "drawn"), (32, 1, None), (32, 7, "pair")])
def test_top_p_kernels_compile(nvidia_backend, bits, step, banned):
    """Every launch setting of the top-p filter: bf16 (16-bit keys) and float32 scores, plain, the drawn
    distribution's gated passes and the source chain of a pair."""
    from dare.rollout.engine import top_p_kernel as k
    from dare.rollout.engine.proposal_kernel import BLOCK, NUM_WARPS

    types = dict(TYPES, Logits="*bf16" if bits == 16 else "*fp32")
    passes = bits // 4
    flags = dict(PER_SLICE=76800, SLICES=2, SLICE_BLOCK=2, KEY_BITS=bits, SCALED=True, WITH_BANNED=banned == "pair",
                 WITHOUT_BANNED=banned == "drawn", GATED=banned == "drawn")
    ptx = compile_for_hopper(k._radix_kernel, k.RADIX_WARPS, types, PASS=step, COUNTS=step == passes - 1,
                             BLOCK=k.RADIX_BLOCK, **flags)
    assert "ld.global" in ptx
    if step == 0:
        compile_for_hopper(k._lse_kernel, NUM_WARPS, types, PER_SLICE=76800, SLICES=2, BLOCK=BLOCK, KEY_BITS=bits,
                           SCALED=True, WITHOUT_BANNED=banned is not None)
        compile_for_hopper(k._bins_kernel, k.RADIX_WARPS, types, BLOCK=k.RADIX_BLOCK, **flags)
        compile_for_hopper(k._compact_kernel, NUM_WARPS, types, BLOCK=BLOCK, **flags)
    compile_for_hopper(k._cut_kernel, k.RADIX_WARPS, types, LAST=passes - 1, BLOCK=k.RADIX_BLOCK,
                       PAIR=banned == "pair", **flags)
    compile_for_hopper(k._write_kernel, NUM_WARPS, types, BLOCK=BLOCK, PAIR=banned == "pair",
                       **{name: flags[name] for name in k.WRITE_FLAGS})


def loop_body(ptx: str) -> list[str]:
    """The instructions of the PTX's (first) innermost loop: from its header label to the branch back to it."""
    lines = [line.strip() for line in ptx.splitlines()]
    header = next(i for i, line in enumerate(lines) if "Inner Loop Header" in line)
    start = max(i for i in range(header + 1) if lines[i].startswith("$L__BB"))  # the label (or the line before)
    label = lines[start].split(":")[0]
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("@") and "bra" in lines[i]
               and lines[i].rstrip(";").endswith(label))
    return [line for line in lines[start + 1:end + 1] if line and not line.startswith(("//", "$", ".loc"))]


@pytest.mark.parametrize("kernel,bits,counts", [("bins", 16, None), ("bins", 32, None), ("radix", 16, False),
                                                ("radix", 16, True), ("radix", 32, True)])
def test_top_p_histogram_loop_stays_in_registers(nvidia_backend, kernel, bits, counts):
    """Each thread keeps all 16 buckets of its entries: no shared memory or barrier in the histogram loops (the
    value bins over the whole vocabulary, the radix passes over the candidates). With ``[BLOCK, 16]`` accumulators
    Triton spread the buckets over threads and converted every tile through shared memory, computing each entry's
    key 16 times (711-812 PTX instructions per thread and 2 entries, 4 barriers; now under 330 with an exactly
    rounded division; the measured kernel was compute-bound at 40x its read floor)."""
    from dare.rollout.engine import top_p_kernel as k

    types = dict(TYPES, Logits="*bf16" if bits == 16 else "*fp32")
    flags = dict(BLOCK=k.RADIX_BLOCK, PER_SLICE=76800, SLICES=2, SLICE_BLOCK=2, KEY_BITS=bits, SCALED=True,
                 WITH_BANNED=False, WITHOUT_BANNED=False, GATED=False)
    if kernel == "bins":
        ptx = compile_for_hopper(k._bins_kernel, k.RADIX_WARPS, types, **flags)
    else:
        ptx = compile_for_hopper(k._radix_kernel, k.RADIX_WARPS, types, PASS=1, COUNTS=counts, **flags)
    body = loop_body(ptx)
    assert not [line for line in body if "bar.sync" in line or "barrier" in line or ".shared" in line], body
    assert len(body) < 200 * k.RADIX_BLOCK // (32 * k.RADIX_WARPS), len(body)  # per thread-iteration's entries


@pytest.mark.parametrize("sampled,scaled,want,entropy,filtered,bits,rounding", [
    (False, False, True, False, False, 16, 1), (True, True, True, True, False, 16, 1),
    (True, False, False, False, False, 16, 0), (True, True, True, True, True, 16, 2),
    (False, False, True, False, True, 32, 0), (True, True, True, False, True, 32, 0),
    (False, False, True, True, True, 16, 1)])
def test_proposal_kernels_compile(nvidia_backend, sampled, scaled, want, entropy, filtered, bits, rounding):
    """The proposal kernels, with and without the top-p nuclei (16-bit keys of bf16 logits, 32-bit keys of
    float32 ones), confidences rounded to bf16 / fp16 or not, greedy tokens by rounded probability."""
    from dare.rollout.engine import proposal_kernel as k
    from dare.rollout.engine.noise import GOLDEN, STREAM_CONFIDENCE, STREAM_SAMPLE

    types = dict(TYPES, Logits="*bf16" if bits == 16 else "*fp32")
    nuclei = dict(FILTER_SOURCE=filtered and want, KEY_BITS=bits)
    compile_for_hopper(k._partial_kernel, k.NUM_WARPS, types, PER_SLICE=2048, SLICES=17, BLOCK=k.BLOCK,
                       SAMPLED=sampled, SCALED_SOURCE=scaled, WANT_SOURCE=want, STREAM=STREAM_SAMPLE, GOLDEN=GOLDEN,
                       FILTERED=filtered, ROUND=rounding, **nuclei)
    by_probability = not sampled and want and rounding > 0
    compile_for_hopper(k._final_kernel, 1, types, SLICES=17, SLICE_BLOCK=32, SAMPLED=sampled, SCALED_SOURCE=scaled,
                       WANT_SOURCE=want, ENTROPY=entropy, STREAM=STREAM_CONFIDENCE, GOLDEN=GOLDEN, ROUND=rounding,
                       BY_PROBABILITY=by_probability, **nuclei)
    if entropy:
        compile_for_hopper(k._entropy_kernel, k.NUM_WARPS, types, PER_SLICE=2048, SLICES=17, SLICE_BLOCK=32,
                           BLOCK=k.BLOCK, SCALED_SOURCE=scaled, ROUND=rounding, **nuclei)
    if by_probability:
        ptx = compile_for_hopper(k._probable_kernel, k.NUM_WARPS, types, PER_SLICE=2048, SLICES=17, SLICE_BLOCK=32,
                                 BLOCK=k.BLOCK, FILTERED=filtered, ROUND=rounding, **nuclei)
        assert "ld.global" in ptx


@pytest.mark.parametrize("final,masked,block_m", [(True, True, 32), (False, True, 64), (False, False, 16)])
def test_decode_attention_kernels_compile(nvidia_backend, final, masked, block_m):
    from dare.models import decode_attention as k

    def typed(kernel, acc):
        return {**ATTENTION_TYPES, "Acc": acc, **{p.name: "i32" for p in kernel.params
                                                  if p.name.startswith("s") and len(p.name) == 3}}

    compile_for_hopper(k._partial_kernel, 4, typed(k._partial_kernel, "*bf16" if final else "*fp32"),
                       PER_SPLIT=128, SPLITS=1 if final else 3, BLOCK_M=block_m, BLOCK_N=k.BLOCK_N, HEAD=128,
                       FINAL=final, MASKED=masked)
    if not final:
        compile_for_hopper(k._merge_kernel, 4, typed(k._merge_kernel, "*fp32"), SPLITS=3, BLOCK_M=block_m,
                           HEAD=128)
