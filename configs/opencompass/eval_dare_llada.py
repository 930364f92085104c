"""LLaDA-8B-Instruct in OpenCompass through the DARE plug-in: generation benchmarks with the Fast-dLLM
sampler (dual cache, threshold decoding), multiple choice by MC-ELBO likelihood.

    dare eval opencompass configs/opencompass/eval_dare_llada.py -w outputs/opencompass_llada

(or plain ``opencompass`` with the same arguments; ``dare eval opencompass`` checks the config first and turns
loading errors into one line).

Swap ``path`` for any DARE family (Dream, LLaDA-MoE, SDAR, LLaDA2; a local checkpoint or ``tiny:FAMILY``),
``sampler`` for any registered sampler and its settings (``dare.rollout.SamplerConfig`` fields), and add
``adapter="runs/x/final"`` to evaluate a LoRA adapter.
"""

from mmengine.config import read_base

from dare.eval.opencompass import DareDiffusionModel

with read_base():
    from opencompass.configs.datasets.gsm8k.gsm8k_gen import gsm8k_datasets
    from opencompass.configs.datasets.hellaswag.hellaswag_ppl import hellaswag_datasets
    from opencompass.configs.datasets.humaneval.humaneval_gen import humaneval_datasets
    from opencompass.configs.datasets.mmlu.mmlu_ppl import mmlu_datasets

datasets = [*gsm8k_datasets, *humaneval_datasets, *mmlu_datasets, *hellaswag_datasets]

models = [
    dict(
        type=DareDiffusionModel,
        abbr="llada-8b-instruct-fastdllm-dual",
        path="GSAI-ML/LLaDA-8B-Instruct",
        sampler=dict(sampler="fastdllm", cache="dual", block_length=32, threshold=0.9),
        likelihood=dict(mc_samples=32, schedule="discrete"),   # ppl datasets: MC-ELBO per option
        dtype="bfloat16",
        max_seq_len=4096,
        max_out_len=256,
        batch_size=16,
        run_cfg=dict(num_gpus=1),
    )
]
