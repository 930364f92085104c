"""LLaDA-MoE-7B-A1B (inclusionAI/LLaDA-MoE-7B-A1B-Base/-Instruct): OLMoE-style masked diffusion MoE.

The released config.json says ``model_type: "llada"`` like dense LLaDA; :class:`LLaDAConfig.from_dict`
dispatches configs with ``num_experts`` here (``model_type: "lladamoe"``, dllm's rename, also loads).
Routing follows the released file: softmax in fp32, optional ``expert_bias`` added to the probabilities,
top-k **without** renormalisation (``norm_topk_prob`` is ignored by the reference too).
"""

from __future__ import annotations

from dare.errors import ConfigError
from dare.models.base import DiffusionConfig, reject_rope_scaling
from dare.models.decoder import DecoderLayer, DecoderLM, SelfAttention, SoftmaxTopKMoE
from dare.models.layers import SwiGLU
from dare.models.moe import register_expert_checkpoint_names
from dare.models.spec import FamilySpec, register_family


class LLaDAMoEConfig(DiffusionConfig):
    """LLaDA-MoE config with the released keys. ``-1`` placeholders of the reference constructor count as missing."""

    model_type = "lladamoe"
    required_keys = (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_experts",
        "num_experts_per_tok", "expert_intermediate_size", "rope_theta", "partial_rotary_factor",
    )

    def __init__(
        self,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
        dense_intermediate_size: int | None = None,
        expert_intermediate_size: int | None = None,
        shared_expert_intermediate_size: int | None = None,
        num_hidden_layers: int | None = None,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        num_experts: int | None = None,
        num_experts_per_tok: int | None = None,
        moe_layer_freq: list[int] | int | None = None,
        qk_layernorm: bool = True,
        rope_theta: float | None = None,
        partial_rotary_factor: float | None = None,
        rope_scaling: dict | None = None,
        max_position_embeddings: int = 8192,
        rms_norm_eps: float = 1e-5,
        hidden_act: str = "silu",
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        clip_qkv: float | None = None,
        moe_router_enable_expert_bias: bool | None = None,
        router_aux_loss_coef: float = 0.01,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = False,
        mask_token_id: int | None = None,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dense_intermediate_size = dense_intermediate_size
        self.expert_intermediate_size = expert_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_layer_freq = moe_layer_freq
        self.qk_layernorm = qk_layernorm
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        reject_rope_scaling(rope_scaling, "LLaDA-MoE")
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.hidden_act = hidden_act
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.clip_qkv = clip_qkv
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.router_aux_loss_coef = router_aux_loss_coef
        self.initializer_range = initializer_range
        self.tie_word_embeddings = tie_word_embeddings
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, **kwargs)

    def validate_for_model(self) -> None:
        placeholders = [k for k in self.required_keys if getattr(self, k, None) == -1]
        if placeholders:
            raise ConfigError(f"LLaDAMoEConfig: config.json leaves placeholder -1 for {', '.join(placeholders)}")
        super().validate_for_model()
        if not 0 < self.partial_rotary_factor <= 1:
            raise ConfigError(f"LLaDA-MoE: partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1]")
        if self.hidden_act != "silu" or self.attention_dropout:
            raise ConfigError("LLaDA-MoE: only hidden_act='silu' without attention dropout is supported")
        if len(self.moe_layers) != self.num_hidden_layers:
            raise ConfigError(
                f"LLaDA-MoE: moe_layer_freq has {len(self.moe_layers)} entries for {self.num_hidden_layers} layers"
            )
        if any(not m for m in self.moe_layers) and not self.dense_intermediate_size:
            raise ConfigError("LLaDA-MoE: dense layers (moe_layer_freq 0) need dense_intermediate_size")

    @property
    def moe_layers(self) -> list[bool]:
        """Whether each layer is a MoE layer (``moe_layer_freq`` list; an int applies to every layer)."""
        freq = self.moe_layer_freq if self.moe_layer_freq is not None else 1
        if isinstance(freq, int):
            return [bool(freq)] * self.num_hidden_layers
        return [bool(f) for f in freq]

    @property
    def has_shared_expert(self) -> bool:
        return bool(self.shared_expert_intermediate_size) and self.shared_expert_intermediate_size > 0


class LLaDAMoEModelLM(DecoderLM):
    """LLaDA-MoE masked diffusion LM (``architectures: ["LLaDAMoEModelLM"]``)."""

    config_class = LLaDAMoEConfig
    _no_split_modules = ["DecoderLayer"]

    @staticmethod
    def rotary_dim(config: LLaDAMoEConfig) -> int:
        return int(config.hidden_size // config.num_attention_heads * config.partial_rotary_factor)

    @staticmethod
    def build_layers(config: LLaDAMoEConfig) -> list:
        hidden = config.hidden_size
        head_dim = hidden // config.num_attention_heads
        layers = []
        for i, is_moe in enumerate(config.moe_layers):
            if is_moe:
                mlp = SoftmaxTopKMoE(
                    hidden, config.expert_intermediate_size, config.num_experts, config.num_experts_per_tok,
                    normalize=False, expert_bias=bool(config.moe_router_enable_expert_bias),
                )
            else:
                mlp = SwiGLU(hidden, config.dense_intermediate_size)
            shared = SwiGLU(hidden, config.shared_expert_intermediate_size) if is_moe and config.has_shared_expert else None
            attn = SelfAttention(
                hidden, config.num_attention_heads, config.num_key_value_heads, head_dim, i,
                qkv_bias=config.attention_bias, o_bias=config.attention_bias,
                qk_norm_eps=config.rms_norm_eps if config.qk_layernorm else None, clip_qkv=config.clip_qkv,
            )
            layers.append(DecoderLayer(hidden, config.rms_norm_eps, attn, mlp, shared))
        return layers


register_expert_checkpoint_names(LLaDAMoEModelLM)


def tiny_llada_moe_config(vocab_size: int = 264, mask_token_id: int = 259, eos_token_id: int = 258,
                          pad_token_id: int = 256, **overrides) -> dict:
    """config.json of a tiny LLaDA-MoE (2 layers: one dense, one MoE with 8 experts, top-2; models.md 3.4)."""
    config = dict(
        model_type="llada", architectures=["LLaDAMoEModelLM"], hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
        expert_intermediate_size=32, dense_intermediate_size=128, moe_layer_freq=[0, 1],
        shared_expert_intermediate_size=None, qk_layernorm=True, rope_theta=50000.0, partial_rotary_factor=1.0,
        rope_scaling=None, max_position_embeddings=512, rms_norm_eps=1e-5, hidden_act="silu", attention_bias=False,
        attention_dropout=0.0, clip_qkv=None, moe_router_enable_expert_bias=False, moe_router_score_function="softmax",
        norm_topk_prob=False, router_aux_loss_coef=0.01, initializer_range=0.02, tie_word_embeddings=False,
        vocab_size=vocab_size, mask_token_id=mask_token_id, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
        use_cache=False,
    )
    config.update(overrides)
    return config


LLADA_MOE = register_family(
    FamilySpec(
        name="llada_moe",
        description="LLaDA-MoE-7B-A1B: masked diffusion mixture of experts, full attention",
        config_class=LLaDAMoEConfig,
        model_class=LLaDAMoEModelLM,
        attention="full",
        logit_shift=0,
        mask_token_id=156895,
        eos_token_id=156892,
        pad_token_id=156892,
        lora_targets=r".*\.layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)",
        tiny_config=tiny_llada_moe_config,
    )
)
