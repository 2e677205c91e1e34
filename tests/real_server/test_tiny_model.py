"""The tiny model the real-server tests and GPU benchmarks serve: every token it can generate is text on its own."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="needs the transformers[serving] extra (scripts/test.sh installs it)")

from tests.real_server.tiny_model import build_tiny_llama  # noqa: E402


def test_every_token_the_tiny_model_can_generate_decodes_to_text_alone(tmp_path):
    # a byte token that is no UTF-8 on its own is held back by transformers serve's stream until it decodes: with
    # the full byte alphabet a random model streamed no text for some requests (the H200 goodput run's "failures")
    from tokenizers.decoders import DecodeStream
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_llama(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(path)
    special = set(tok.all_special_ids)
    bad = {}
    for token_id in range(len(tok)):
        if token_id in special:
            continue
        text = DecodeStream([], skip_special_tokens=True).step(tok._tokenizer, token_id)
        if not text or "\ufffd" in text:
            bad[token_id] = text
    assert not bad, bad
    # and special tokens (empty text when skipped) are never the greedy choice: their output rows are zero
    model = AutoModelForCausalLM.from_pretrained(path)
    for token_id in special:
        assert float(model.lm_head.weight[token_id].abs().sum()) == 0.0
