"""A tiny random Llama-style model with its own tokenizer, built on the spot (no download): what the real-server
tests and ``benchmarks/real_server_gpu.py`` serve with ``transformers serve``.

The tokenizer is a byte-level BPE trained here with the ``tokenizers`` library on a few hundred random sentences;
the model is a ``LlamaForCausalLM`` with random weights, saved with ``save_pretrained``. The rows of the special
tokens in the output layer are zeroed, so greedy decoding (the load's ``temperature: 0``) never picks one: every
request generates its full ``max_tokens`` even on a server that refuses ``ignore_eos``, and no token decodes to
nothing. The tokenizer's alphabet is the corpus's characters only (not all 256 bytes): a random model choosing
among byte tokens emits bytes that are no UTF-8, which ``transformers serve`` holds back from its stream until they
decode, so a request could stream no text at all and its time to first token would be its whole latency.
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")


def build_tiny_llama(
    dest: str | Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab: int = 300,
    max_positions: int = 1024,
    dtype: str = "float32",
    seed: int = 0,
) -> Path:
    """Write a random Llama (config, safetensors weights, tokenizer, chat template) to ``dest``; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(300)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"]))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(dest)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    with torch.no_grad():
        for special in tok.all_special_ids:
            model.lm_head.weight[special].zero_()
    model.save_pretrained(dest)
    return dest


if __name__ == "__main__":  # pragma: no cover - python -m tests.real_server.tiny_model DEST
    import sys

    print(build_tiny_llama(sys.argv[1]))
