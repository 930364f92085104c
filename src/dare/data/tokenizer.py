"""The byte-level tokenizer DARE ships for tiny models and synthetic tasks.

A real HF fast tokenizer (``tokenizer.json``, loadable with ``AutoTokenizer``) built with the
``tokenizers`` library: byte-level BPE **without merges**, so every UTF-8 byte is one token and any text
round-trips. Ids 0-255 are the bytes; special tokens follow:

=====  ================  =======================================
id     token             role
=====  ================  =======================================
256    ``<|pad|>``       padding
257    ``<|bos|>``       beginning of text
258    ``<|eos|>``       end of text (completions stop here)
259    ``<|mask|>``      diffusion mask
260    ``<|system|>``    chat role marker
261    ``<|user|>``      chat role marker
262    ``<|assistant|>`` chat role marker
263    ``<|eot|>``       end of turn
=====  ================  =======================================

A 264-token vocabulary keeps tiny models tiny; the chat template is
``<|bos|><|user|>{q}<|eot|><|assistant|>``.
"""

from __future__ import annotations

from pathlib import Path

BYTE_VOCAB = 256
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>", "<|system|>", "<|user|>", "<|assistant|>", "<|eot|>")
VOCAB_SIZE = BYTE_VOCAB + len(SPECIAL_TOKENS)
PAD_ID, BOS_ID, EOS_ID, MASK_ID = 256, 257, 258, 259
EOT_ID = 263

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map used by ByteLevel pre-tokenisation."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes)}


def build_byte_tokenizer():
    """Return a ``PreTrainedTokenizerFast`` over bytes with DARE's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: byte for byte, symbol in _byte_to_unicode().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        mask_token="<|mask|>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|eot|>"],
        model_max_length=4096,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == MASK_ID and len(tokenizer) == VOCAB_SIZE
    return tokenizer


def save_byte_tokenizer(directory: str | Path):
    """Write the byte tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ...) into ``directory``."""
    tokenizer = build_byte_tokenizer()
    tokenizer.save_pretrained(str(directory))
    return tokenizer
