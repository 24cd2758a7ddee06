"""Build a tiny random-weight Llama, its tokenizer and one LoRA adapter, entirely offline.

Run with the vLLM venv's interpreter (it has torch, transformers, tokenizers and safetensors)::

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv-vllm/bin/python \\
        tests/vllm/build_tiny_model.py .venv-vllm/tiny-llama

Output layout::

    <dir>/config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...
    <dir>/lora-a/adapter_config.json, adapter_model.safetensors

The tokenizer is a byte-level BPE trained on a few in-memory sentences (vocabulary 374: the 256
byte symbols, three special tokens and some merges), so any text tokenizes without an unknown
token. The model (2 layers, hidden size 64, ~130k parameters) produces random text; what the
tests need is a real vLLM engine with real scheduling, prefix caching, metrics and KV events,
not sensible output. Weights are seeded, so two builds give the same files.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 374
HIDDEN = 64
LAYERS = 2
HEAD_DIM = 64
LORA_RANK = 8
SPECIALS = ("<s>", "</s>", "<unk>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "An endpoint picker routes each request to the model server that serves it best.",
    "Prefix caching lets a server reuse the key and value blocks of a shared prompt prefix.",
    "user: hello there, how are you today? assistant: fine, thank you very much.",
    "0123456789 alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu",
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus gives the trainer enough pair counts to fill the vocabulary.
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def write_lora(directory: Path, base_model: Path) -> None:
    """A LoRA adapter in PEFT's on-disk format, written without peft."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model),
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(LAYERS):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, HIDDEN) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(HEAD_DIM, LORA_RANK) * 0.02
    save_file(tensors, str(directory / "adapter_model.safetensors"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTPUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    model = build_model(tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    write_lora(out / "lora-a", out)
    params = sum(p.numel() for p in model.parameters())
    print(f"   tiny model: {params} parameters, vocab {len(tokenizer)}, into {out}")
    print(f"   built in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
