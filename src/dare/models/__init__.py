"""Native diffusion LM families, registered with transformers' Auto classes on import."""

from dare.models.attention import ATTENTION_BACKENDS, AttentionLayout, attend, build_layout
from dare.models.base import DiffusionConfig, DiffusionLM, DiffusionLMOutput
from dare.models.cache import KVCache
from dare.models.compile import compile_blocks
from dare.models.dream import DreamConfig, DreamModel
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
from dare.models.llada_moe import LLaDAMoEConfig, LLaDAMoEModelLM
from dare.models.loading import load_model, load_tokenizer
from dare.models.sdar import SDARConfig, SDARForCausalLM, SDARMoeConfig, SDARMoeForCausalLM
from dare.models.spec import FAMILIES, FamilySpec, TokenIds, family_of, get_family, register_family
from dare.models.tiny import tiny_model

__all__ = [
    "ATTENTION_BACKENDS", "AttentionLayout", "attend", "build_layout", "DiffusionConfig", "DiffusionLM",
    "DiffusionLMOutput", "KVCache", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM",
    "LLaDAMoEConfig", "LLaDAMoEModelLM", "LLaDA2MoeConfig", "LLaDA2MoeModelLM", "SDARConfig", "SDARForCausalLM",
    "SDARMoeConfig", "SDARMoeForCausalLM", "FAMILIES", "FamilySpec", "TokenIds", "family_of", "get_family",
    "register_family", "load_model", "load_tokenizer", "compile_blocks", "tiny_model",
]
