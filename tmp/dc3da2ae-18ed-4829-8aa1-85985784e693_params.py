datasets = [
    [
        dict(
            abbr='tiny_mcq',
            eval_cfg=dict(
                evaluator=dict(
                    type=
                    'opencompass.openicl.icl_evaluator.icl_hf_evaluator.AccEvaluator'
                )),
            infer_cfg=dict(
                inferencer=dict(
                    type=
                    'opencompass.openicl.icl_inferencer.icl_ppl_inferencer.PPLInferencer'
                ),
                prompt_template=dict(
                    template=dict(
                        A=dict(round=[
                            dict(
                                prompt=
                                'Question: {question}\nA. {A}\nB. {B}\nC. {C}\nD. {D}',
                                role='HUMAN'),
                            dict(prompt='Answer: A', role='BOT'),
                        ]),
                        B=dict(round=[
                            dict(
                                prompt=
                                'Question: {question}\nA. {A}\nB. {B}\nC. {C}\nD. {D}',
                                role='HUMAN'),
                            dict(prompt='Answer: B', role='BOT'),
                        ]),
                        C=dict(round=[
                            dict(
                                prompt=
                                'Question: {question}\nA. {A}\nB. {B}\nC. {C}\nD. {D}',
                                role='HUMAN'),
                            dict(prompt='Answer: C', role='BOT'),
                        ]),
                        D=dict(round=[
                            dict(
                                prompt=
                                'Question: {question}\nA. {A}\nB. {B}\nC. {C}\nD. {D}',
                                role='HUMAN'),
                            dict(prompt='Answer: D', role='BOT'),
                        ])),
                    type=
                    'opencompass.openicl.icl_prompt_template.PromptTemplate'),
                retriever=dict(
                    type=
                    'opencompass.openicl.icl_retriever.icl_zero_retriever.ZeroRetriever'
                )),
            path='configs/opencompass/data/tiny_mcq.jsonl',
            reader_cfg=dict(
                input_columns=[
                    'question',
                    'A',
                    'B',
                    'C',
                    'D',
                ],
                output_column='answer'),
            type='opencompass.datasets.custom.CustomDataset'),
    ],
]
eval = dict(runner=dict(task=dict(dump_details=True)))
models = [
    dict(
        abbr='tiny-llada-fastdllm',
        batch_size=4,
        device='cpu',
        dtype='float32',
        likelihood=dict(mc_samples=4),
        max_out_len=16,
        max_seq_len=512,
        path='tiny:llada',
        run_cfg=dict(num_gpus=0),
        sampler=dict(block_length=8, sampler='fastdllm'),
        type='dare.eval.opencompass.DareDiffusionModel'),
]
work_dir = '/tmp/pytest-of-root/pytest-37/test_opencompass_runs_the_tiny0/20261203_080258'
