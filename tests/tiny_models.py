"""Tiny random-weight models and a real byte-level BPE tokenizer, built in-process for tests.

No network, no downloads: the tokenizer is trained by the `tokenizers` library on a few lines of
text, the models are built from configs with random weights. Weights are drawn with a large
initializer range so that logits are peaked and floating-point near-ties between the two best
tokens are rare (greedy equality tests then compare long token sequences meaningfully).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = [
    "The cat is sitting on the mat. The dog is sleeping by the door.",
    "Speculative decoding lets a small draft model propose tokens that a large model verifies.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Größe, naïve café, 東京, emoji 🙂 and other multi-byte characters.",
    "A key-value cache stores the attention keys and values of every past position.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
]
SPECIALS = ["<s>", "</s>", "<pad>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def build_tokenizer(vocab_size: int = 320) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def hf_tokenizer(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


UNTIED = ("mistral", "qwen3", "phi3", "olmo2")  # the rest tie the head to the embedding
# What each family's tiny model exercises beyond the Llama baseline (tests/exporter/
# test_families.py): several layer types, windows shorter than a prompt plus its generation,
# head_dim != hidden / heads, full multi-head attention, partial rotary, NoPE layers, multipliers.
FEATURES: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": None},
    "qwen3": {
        "head_dim": 32,
        "use_sliding_window": True,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    "gemma3": {
        "head_dim": 32,
        "num_key_value_heads": 1,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 24,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "phi3": {
        "num_attention_heads": 2,  # head_dim 32: half of it rotated, a width GQA takes
        "num_key_value_heads": 2,  # full multi-head attention
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 256,
    },
    "smollm3": {"no_rope_layers": [1, 1, 0], "use_sliding_window": False},
    "granite": {
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "attention_multiplier": 0.2,
        "logits_scaling": 3.0,
    },
    "olmo2": {},
}


def _classes() -> dict[str, tuple[Any, Any]]:
    import transformers as t

    return {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM),
        "mistral": (t.MistralConfig, t.MistralForCausalLM),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM),
        "gemma3": (t.Gemma3TextConfig, t.Gemma3ForCausalLM),
        "phi3": (t.Phi3Config, t.Phi3ForCausalLM),
        "smollm3": (t.SmolLM3Config, t.SmolLM3ForCausalLM),
        "granite": (t.GraniteConfig, t.GraniteForCausalLM),
        "olmo2": (t.Olmo2Config, t.Olmo2ForCausalLM),
    }


def build_model(
    arch: str,
    vocab_size: int,
    seed: int,
    layers: int = 2,
    hidden: int = 64,
    max_positions: int = 256,
    init_range: float = 0.3,
) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    common: dict[str, Any] = dict(
        vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=2
    )
    if arch == "gpt2":
        cfg = GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            n_positions=max_positions,
            initializer_range=init_range,
            **common,
        )
        model = GPT2LMHeadModel(cfg)
    else:
        config_cls, model_cls = _classes()[arch]
        features = FEATURES.get(arch, {})
        per_layer = features.get("layer_types") or features.get("no_rope_layers") or []
        layers = max(layers, len(per_layer))
        kwargs: dict[str, Any] = dict(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            initializer_range=init_range,
            tie_word_embeddings=arch not in UNTIED,
            rope_theta=10000.0,
            **common,
        )
        kwargs.update(features)
        model = model_cls(config_cls(**kwargs))
    return model.eval()


def perturbed_copy(model: Any, noise: float, seed: int) -> Any:
    """The same model with Gaussian noise on every weight: a draft that agrees often, not always."""
    import copy

    import torch

    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    return other.eval()


def save(model: Any, tokenizer: Any, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    hf_tokenizer(tokenizer).save_pretrained(folder)
    return folder


def build_small_vocab_tokenizer(words: int = 8) -> Any:
    """A word-level tokenizer of 4 specials + `words` words: outcomes small enough to count."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for i in range(words):
        vocab[chr(ord("a") + i)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok
