"""Dream-7B (Dream-org/Dream-v0-Base-7B/-Instruct-7B; DiffuCoder and Dream-Coder share it).

Qwen2.5 layout run bidirectionally: q/k/v projections carry biases, GQA, RoPE theta 1e6. Dream is
initialised from an autoregressive model, so the output at position ``i`` predicts token ``i + 1``: the
family spec (``logit_shift=1``) realigns logits for every caller.
"""

from __future__ import annotations

from dare.errors import ConfigError
from dare.models.base import DiffusionConfig, reject_rope_scaling
from dare.models.decoder import DecoderLayer, DecoderLM, SelfAttention
from dare.models.layers import SwiGLU
from dare.models.spec import FamilySpec, register_family


class DreamConfig(DiffusionConfig):
    """Dream config with the released ``config.json`` keys (``model_type: "Dream"``, Qwen2 names)."""

    model_type = "Dream"
    required_keys = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "rope_theta",
    )

    def __init__(
        self,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
        intermediate_size: int | None = None,
        num_hidden_layers: int | None = None,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        rope_theta: float | None = None,
        rope_scaling: dict | None = None,
        use_sliding_window: bool = False,
        sliding_window: int | None = None,
        max_window_layers: int | None = None,
        attention_dropout: float = 0.0,
        tie_word_embeddings: bool = False,
        mask_token_id: int | None = None,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        bos_token_id: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        reject_rope_scaling(rope_scaling, "Dream")
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.attention_dropout = attention_dropout
        self.tie_word_embeddings = tie_word_embeddings
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id, **kwargs)

    def validate_for_model(self) -> None:
        super().validate_for_model()
        if self.use_sliding_window:
            raise ConfigError("Dream: use_sliding_window=true is not supported (released checkpoints use full attention)")
        if self.hidden_act != "silu":
            raise ConfigError(f"Dream: hidden_act={self.hidden_act!r} is not supported (expected 'silu')")
        if self.attention_dropout:
            raise ConfigError("Dream: attention_dropout must be 0")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("Dream: hidden_size, num_attention_heads and num_key_value_heads do not divide")


class DreamModel(DecoderLM):
    """Dream masked diffusion LM (``architectures: ["DreamModel"]``)."""

    config_class = DreamConfig
    _no_split_modules = ["DecoderLayer"]

    @staticmethod
    def build_layers(config: DreamConfig) -> list:
        head_dim = config.hidden_size // config.num_attention_heads
        return [
            DecoderLayer(
                config.hidden_size,
                config.rms_norm_eps,
                SelfAttention(
                    config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim, i,
                    qkv_bias=True,
                ),
                SwiGLU(config.hidden_size, config.intermediate_size),
            )
            for i in range(config.num_hidden_layers)
        ]


def tiny_dream_config(vocab_size: int = 264, mask_token_id: int = 259, eos_token_id: int = 258,
                      pad_token_id: int = 256, **overrides) -> dict:
    """config.json of a tiny Dream (2 layers, hidden 64, GQA 4:2, q/k/v biases; models.md 4.4)."""
    config = dict(
        model_type="Dream", architectures=["DreamModel"], vocab_size=vocab_size, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        hidden_act="silu", max_position_embeddings=512, rope_theta=1000000.0, rope_scaling=None,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
        max_window_layers=2, attention_dropout=0.0, initializer_range=0.02, mask_token_id=mask_token_id,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=257, use_cache=False,
    )
    config.update(overrides)
    return config


DREAM = register_family(
    FamilySpec(
        name="dream",
        description="Dream-7B, DiffuCoder: masked diffusion from Qwen2.5, logits shifted by one",
        config_class=DreamConfig,
        model_class=DreamModel,
        attention="full",
        logit_shift=1,
        mask_token_id=151666,
        eos_token_id=151643,
        pad_token_id=151643,
        eot_token_id=151645,
        lora_targets=r".*\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))",
        tiny_config=tiny_dream_config,
    )
)
