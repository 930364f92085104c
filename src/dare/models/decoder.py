"""HF-Llama-style decoder pieces (``model.embed_tokens / layers.N.{self_attn, mlp, ...} / norm`` + ``lm_head``).

Dream (Qwen2 layout), LLaDA-MoE (OLMoE layout) and SDAR (Qwen3 layout) share these modules; each family
module only says which options its layers use.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dare.models.base import DiffusionConfig, DiffusionLM, rotary_attention
from dare.models.fusion import project, project_one
from dare.models.layers import RMSNorm
from dare.models.moe import ExpertBank


class SelfAttention(nn.Module):
    """``q/k/v/o_proj`` attention with optional per-head q/k RMSNorm (``q_norm``/``k_norm``) and qkv clipping."""

    fused_groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",)}

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        layer_idx: int,
        *,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm_eps: float | None = None,
        clip_qkv: float | None = None,
    ):
        super().__init__()
        self.layer_idx, self.n_heads, self.n_kv, self.head_dim = layer_idx, n_heads, n_kv_heads, head_dim
        self.clip_qkv = clip_qkv
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=o_bias)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)

    def forward(self, x, rope, layout, cache, backend, keep=None):
        b, length, _ = x.shape
        q, k, v = project(self, "qkv", x)
        q = q.view(b, length, self.n_heads, self.head_dim)
        k = k.view(b, length, self.n_kv, self.head_dim)
        v = v.view(b, length, self.n_kv, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        return project_one(self, "o", rotary_attention(q, k, v, rope, layout, cache, self, backend, keep=keep))


class SoftmaxTopKMoE(nn.Module):
    """Token-choice MoE: ``softmax(gate x)`` in fp32 (+ optional ``expert_bias``), top-k, optional renormalisation.

    LLaDA-MoE: no renormalisation, bias added to the probabilities before top-k and kept in the weights.
    Qwen3-MoE/SDAR-MoE: renormalised top-k, no bias. The experts run as grouped matmuls
    (:class:`~dare.models.moe.ExpertBank`); weights are cast to the activation dtype and the ``k`` weighted
    outputs summed in it, like the references.
    """

    def __init__(self, hidden: int, inner: int, n_experts: int, top_k: int, *, normalize: bool, expert_bias: bool):
        super().__init__()
        self.top_k, self.normalize = top_k, normalize
        self.gate = nn.Linear(hidden, n_experts, bias=False)
        self.experts = ExpertBank(n_experts, hidden, inner)
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(n_experts))
        else:
            self.expert_bias = None

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``flat [T, D]`` -> chosen experts ``[T, k]`` and their weights ``[T, k]`` (fp32)."""
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        if self.expert_bias is not None:
            probs = probs + self.expert_bias
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights = self.route(flat)
        outputs = self.experts(flat, chosen)
        out = (outputs * weights.to(outputs.dtype)[..., None]).sum(dim=1)
        return out.to(x.dtype).reshape(shape)


class DecoderLayer(nn.Module):
    """Pre-norm block ``x + self_attn(input_layernorm x)`` then ``+ mlp(post_attention_layernorm h)``.

    ``shared_expert`` (LLaDA-MoE naming), when given, is added to the MLP output. ``attention_name`` is the
    attribute (checkpoint name) of the attention module (``self_attn``; LLaDA2 uses ``attention``).
    """

    def __init__(
        self,
        hidden: int,
        eps: float,
        self_attn: nn.Module,
        mlp: nn.Module,
        shared_expert: nn.Module | None = None,
        attention_name: str = "self_attn",
    ):
        super().__init__()
        self.attention_name = attention_name
        self.add_module(attention_name, self_attn)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        if shared_expert is not None:
            self.shared_expert = shared_expert

    def forward(self, x, rope, layout, cache, backend, keep=None):
        """``keep`` (query rows): only those rows come out (:func:`dare.models.base.rotary_attention`)."""
        attention = getattr(self, self.attention_name)
        attended = attention(self.input_layernorm(x), rope, layout, cache, backend, keep=keep)
        x = (x if keep is None else x.index_select(1, keep)) + attended
        h = self.post_attention_layernorm(x)
        out = self.mlp(h)
        if hasattr(self, "shared_expert"):
            out = out + self.shared_expert(h)
        return x + out


class DecoderBackbone(nn.Module):
    """``embed_tokens``, ``layers``, ``norm`` (the ``model.`` prefix of HF decoder checkpoints).

    ``embedding_name`` is the checkpoint name of the token embedding (LLaDA2: ``word_embeddings``).
    """

    def __init__(
        self, vocab_size: int, hidden: int, eps: float, layers: list[nn.Module], embedding_name: str = "embed_tokens"
    ):
        super().__init__()
        self.embedding_name = embedding_name
        self.add_module(embedding_name, nn.Embedding(vocab_size, hidden))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps)

    @property
    def embedding(self) -> nn.Embedding:
        return getattr(self, self.embedding_name)


class DecoderLM(DiffusionLM):
    """A ``DecoderBackbone`` plus ``lm_head``.

    With ``tie_word_embeddings`` the head shares the embedding matrix (transformers ties the parameters through
    ``_tied_weights_keys``), so a checkpoint may omit ``lm_head.weight`` or carry an identical copy. Families
    implement :meth:`build_layers` and :meth:`rotary_dim`.
    """

    embedding_name = "embed_tokens"
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    rmsnorm_scale_in_fp32 = False
    """Every RMSNorm multiplies by its weight in fp32 before the cast (a family whose reference uses a fused norm)."""

    def __init__(self, config: DiffusionConfig):
        super().__init__(config)
        layers = self.build_layers(config)
        self.model = DecoderBackbone(
            config.vocab_size, config.hidden_size, config.rms_norm_eps, layers, embedding_name=self.embedding_name
        )
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.scale_in_fp32 = self.rmsnorm_scale_in_fp32
        self.rope_dim = self.rotary_dim(config)
        self.rope_theta = float(config.rope_theta)
        self.post_init()

    @staticmethod
    def build_layers(config: DiffusionConfig) -> list[nn.Module]:
        raise NotImplementedError

    @staticmethod
    def rotary_dim(config: DiffusionConfig) -> int:
        return config.hidden_size // config.num_attention_heads

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def embed(self, input_ids):
        return self.model.embedding(input_ids)

    def final_norm(self, x):
        return self.model.norm(x)

    def head(self, x):
        return self.lm_head(x)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        setattr(self.model, self.embedding_name, value)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value
