"""The main job, ``dare demo``: a tiny LLaDA trained from scratch on CPU (SFT to partial competence, then RL),
evaluated before and after with the GSM8K scorer. See :mod:`dare.demo.pipeline`.

```python
from dare.demo import DemoConfig, run_demo
report = run_demo(DemoConfig(out_dir="runs/demo_coupled_grpo", seed=0, algorithm="coupled_grpo"))
report["accuracy"]  # {"init": ..., "sft": ..., "rl": ...}
```
"""

from dare.demo.pipeline import ALGORITHM_DEFAULTS, DemoConfig, demo_algorithms, run_demo

__all__ = ["ALGORITHM_DEFAULTS", "DemoConfig", "demo_algorithms", "run_demo"]
