"""What a server generated is counted, and a request is served only when the server says it finished (issue 50),
against the stand-in server streaming as real servers do: no usage, one chunk per token with some chunks of empty
text, its own token ids, streams cut with ``[DONE]`` and no ``finish_reason``, an empty answer that finished."""

from __future__ import annotations

import time

import pytest

from tests.server.conftest import assert_gone, standin_command
from tests.server.test_launch import DEFAULTS, spy  # noqa: F401 - the fixture
from tests.server.test_served import word_tokenizer  # noqa: F401 - the fixture
from tuner.measurement import Outcome
from tuner.targets.server import loadgen
from tuner.targets.server.launch import ServerProcess, pick_free_port


@pytest.fixture
def standin():
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        port = pick_free_port(36000, 36999)
        argv = [
            a.replace("{host}", "127.0.0.1").replace("{port}", str(port)).replace("{model}", "m")
            for a in standin_command()
        ] + list(args)
        server = ServerProcess(argv, port=port)
        started.append(server)
        assert server.wait_ready(time.time() + 20) is None
        return server

    yield start
    for server in started:
        server.stop()
        assert_gone(server.pgid, server.port)


def _load(tokenizer: str, **kw) -> loadgen.LoadConfig:
    return loadgen.LoadConfig.from_settings(
        {"model": tokenizer, "served_model_name": "m", "output_len": 16, "prompt_len": 4, "requests_per_level": 6, **kw}
    )


def test_usage_is_asked_for_in_the_stream():
    path, body = loadgen._body(loadgen.LoadConfig(), loadgen.RequestSpec("hi", 4))
    assert body["stream_options"] == {"include_usage": True} and body["stream"] is True


def test_one_token_per_chunk_with_empty_text_chunks_counts_every_generated_token(standin, word_tokenizer):  # noqa: F811
    # the server: no usage, one chunk per token, some chunks with empty text (a tokenizer counted 8-15 of 16)
    server = standin("--no-usage", "--empty-text-every", "3", "--tokens-per-second", "800")
    p = loadgen.probe(server.base_url, _load(word_tokenizer))
    assert not p.refused, p.refused
    assert p.config.count_chunks and any("one token counted per content chunk" in a for a in p.adapted), p.adapted
    res = loadgen.run_level(server.base_url, p.config, 2)
    assert [r.output_tokens for r in res.requests] == [16] * 6
    assert res.count_source == "chunks" and res.delivered == 1.0 and res.error_rate == 0.0
    assert ("count:chunks", "c=2") in {(r.metric, r.level) for r in loadgen.level_metrics(res)}


def test_a_gguf_only_model_without_a_tokenizer_still_counts_one_token_chunks(standin, tmp_path):
    # the model is a single GGUF file no AutoTokenizer opens: the chunks' shape alone counts the tokens
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    server = standin("--no-usage", "--empty-text-every", "4", "--tokens-per-second", "800")
    p = loadgen.probe(server.base_url, _load(str(gguf)))
    assert not p.refused, p.refused
    res = loadgen.run_level(server.base_url, p.config, 1)
    assert res.count_source == "chunks" and res.delivered == 1.0


def test_the_servers_own_token_ids_count_when_it_sends_no_usage(standin, tmp_path):
    server = standin("--no-usage", "--stream-token-ids", "--tokens-per-chunk", "4", "--tokens-per-second", "800")
    p = loadgen.probe(server.base_url, _load(str(tmp_path / "none")))
    assert not p.refused, p.refused
    res = loadgen.run_level(server.base_url, p.config, 2)
    assert [r.output_tokens for r in res.requests] == [16] * 6 and res.count_source == "server"


def test_chunks_of_several_tokens_are_not_counted_as_one_each(standin, word_tokenizer):  # noqa: F811
    server = standin("--no-usage", "--tokens-per-chunk", "2", "--tokens-per-second", "800")
    p = loadgen.probe(server.base_url, _load(word_tokenizer))
    assert not p.config.count_chunks and p.config.count_tokens is not None
    res = loadgen.run_level(server.base_url, p.config, 1)
    assert res.count_source == "tokenizer" and [r.output_tokens for r in res.requests] == [16] * 6


def test_a_count_above_the_tokens_asked_is_a_flagged_measurement_error(standin, tmp_path):
    # a tokenizer that splits every character: 'tok ' counted as 4 tokens, 4x max_tokens
    server = standin("--no-usage", "--tokens-per-chunk", "2", "--tokens-per-second", "800")
    cfg = loadgen.LoadConfig(model="m", output_len=8, requests_per_level=4, stream_usage=True, count_tokens=len)
    res = loadgen.run_level(server.base_url, cfg, 1)
    assert res.errors == 4 and res.over_counts == 4 and not res.ok_requests
    assert "a measurement error" in res.first_error() and "for 8 asked" in res.first_error()
    rows = {(r.metric, r.level): r.value for r in loadgen.level_metrics(res)}
    assert rows[("count_over_asked", "c=1")] == 4.0
    assert "100.0% of 4 requests failed" in loadgen.served_problem(res)


def test_a_stream_ended_with_done_and_no_finish_reason_is_an_error_whatever_the_thresholds(
    make_target,
    spy,  # noqa: F811
    word_tokenizer,  # noqa: F811
):
    # the cut streams: `data: [DONE]`, no finish_reason, no usage; loosened thresholds must not make them
    # served requests supplying figures
    target = make_target(
        ["--cancel-on-new", "--no-usage", "--tokens-per-chunk", "2", "--tokens-per-second", "200"],
        levels=[4],
        min_requests=8,
        max_error_rate=1.0,
        min_delivered=0.0,
        tokenizer=word_tokenizer,
    )
    m = target.evaluate(DEFAULTS, time.time() + 60)
    cut = m.metric("error_rate", "c=4")
    assert cut is not None and cut > 0.3, (m.outcome, m.reason, cut)
    # every token the level counts came from a request the server said it finished
    assert m.metric("delivered", "c=4") <= 1.0 - cut + 1e-9


def test_a_stream_without_finish_reason_or_usage_is_not_served(standin, word_tokenizer):  # noqa: F811
    server = standin("--no-usage", "--no-finish-reason", "--tokens-per-second", "800")
    cfg = loadgen.LoadConfig(
        model="m", output_len=8, requests_per_level=3, count_tokens=loadgen.load_tokenizer(word_tokenizer)
    )
    res = loadgen.run_level(server.base_url, cfg, 1)
    assert res.errors == 3 and "no finish_reason and no usage" in res.first_error()


def test_an_empty_answer_that_finished_is_served(standin):
    server = standin("--empty-answer-every", "2", "--tokens-per-second", "800")
    cfg = loadgen.LoadConfig(model="m", output_len=8, requests_per_level=4)
    res = loadgen.run_level(server.base_url, cfg, 1)
    assert res.error_rate == 0.0, res.first_error()
    assert sorted(r.output_tokens for r in res.requests) == [1, 1, 8, 8]
    assert all(r.finish_reason in ("stop", "length") for r in res.requests)


def test_the_counting_method_is_stored_with_the_trial(make_target, spy):  # noqa: F811
    m = make_target(
        ["--no-usage", "--empty-text-every", "5", "--tokens-per-second", "400"], levels=[2], tokenizer="/nonexistent"
    ).evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("count:chunks") == 1.0 and m.metric("count:chunks", "c=2") == 1.0
    assert m.metric("delivered", "c=2") == 1.0


def test_a_gguf_file_that_cannot_be_read_is_refused_naming_it_never_a_guessed_count(standin, tmp_path):
    # chunks of two tokens: the shape does not count them, so the GGUF's own vocabulary is the last way; a file
    # that is no readable GGUF refuses the load, naming the file and the setting
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    server = standin("--no-usage", "--tokens-per-chunk", "2", "--tokens-per-second", "800")
    p = loadgen.probe(server.base_url, _load(str(gguf)))
    assert "cannot count its text" in p.refused and str(gguf) in p.refused and "set `tokenizer`" in p.refused


def _gguf_with_vocabulary(path) -> None:
    """A GGUF file (the ``gguf`` package's writer) whose only tokenizer is the vocabulary it carries: a llama-style
    (SentencePiece BPE) vocabulary in which the stand-in's word ``tok`` with its space is one token."""
    import gguf
    import numpy as np

    pieces = [
        "<unk>",
        "<s>",
        "</s>",
        "\u2581tok\u2581",
        "tok\u2581",
        "\u2581tok",
        "tok",
        "\u2581to",
        "to",
        "ok",
        "\u2581t",
    ]
    pieces += ["\u2581", "t", "o", "k"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(pieces))
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(len(pieces) - 3)])  # merges by these scores
    w.add_token_types([2, 3, 3] + [1] * (len(pieces) - 3))  # unknown, control x2, normal
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((len(pieces), 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gguf_only_model_counts_chunks_of_several_tokens_with_the_vocabulary_the_file_carries(standin, tmp_path):
    # no usage, no token ids, two tokens a chunk: the shape does not count them, and the model is a single GGUF file
    # with no tokenizer beside it; its own vocabulary counts the text, 16 of 16 (a character count would be 64)
    gguf_file = tmp_path / "model.gguf"
    _gguf_with_vocabulary(gguf_file)
    assert loadgen.load_tokenizer(str(gguf_file))("tok " * 16) == 16
    server = standin("--no-usage", "--tokens-per-chunk", "2", "--tokens-per-second", "800")
    p = loadgen.probe(server.base_url, _load(str(gguf_file)))
    assert not p.refused, p.refused
    assert not p.config.count_chunks and p.config.count_tokens is not None
    res = loadgen.run_level(server.base_url, p.config, 2)
    assert res.count_source == "tokenizer" and [r.output_tokens for r in res.requests] == [16] * 6
    assert res.delivered == 1.0 and res.error_rate == 0.0
