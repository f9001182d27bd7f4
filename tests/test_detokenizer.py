"""Incremental detokenisation and stop strings, with a real byte-level BPE tokenizer."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from minedraft import bundled
from minedraft.detokenizer import IncrementalDetokenizer, StopStringMatcher, backend_tokenizer

MULTIBYTE = "naïve — 日本語 🙂 café ≠ ∑ 👩‍💻 done"
# Characters of one to four UTF-8 bytes, which byte-level BPE splits over tokens.
ALPHABET = "ab _\n(){}=:.éüñ—≠∑€日本語中文한국어🙂🚀👩‍💻\t"


class _Encoder:
    """The bundled tokenizer with the two calls these tests make, as transformers spells them."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.backend_tokenizer = tokenizer
        self.eos_token_id = tokenizer.token_to_id("<|endoftext|>")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def tokenizer() -> _Encoder:
    """The bundled target's byte-level BPE tokenizer (it ships with the project), through the
    `tokenizers` library alone, as the gateway loads it."""
    return _Encoder(Tokenizer.from_file(f"{bundled.TARGET}/tokenizer.json"))


def _stream(tokenizer, prompt_ids: list[int], output_ids: list[int], chunk_sizes: list[int]) -> str:
    """Feed `output_ids` in chunks; at every chunk check the text so far against a full decode."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    emitted, fed = "", 0
    for size in chunk_sizes:
        new_ids = output_ids[fed:fed + size]
        fed += len(new_ids)
        emitted += detok.add(new_ids)
        full = tokenizer.decode(output_ids[:fed], skip_special_tokens=True)
        if full.endswith("\ufffd"):
            assert full.startswith(emitted)
        else:
            assert emitted == full, (fed, emitted[-20:], full[-20:])
        if fed == len(output_ids):
            break
    return emitted + detok.flush()


def _random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(length))


def test_random_multibyte_text_streams_as_its_full_decode(tokenizer):
    """Many random strings of 1-4 byte characters, after a random prompt, in random chunks."""
    rng = random.Random(1)
    for _ in range(300):
        prompt = tokenizer.encode(_random_text(rng, rng.randrange(0, 12)), add_special_tokens=False)
        output = tokenizer.encode(_random_text(rng, rng.randrange(1, 40)), add_special_tokens=False)
        sizes = [rng.choice([1, 1, 2, 3, 7]) for _ in output]
        text = _stream(tokenizer, prompt, output, sizes)
        assert text == tokenizer.decode(output, skip_special_tokens=True)


def test_random_token_ids_stream_as_their_full_decode(tokenizer):
    """Arbitrary ids, so also broken UTF-8 (lone continuation bytes, truncated characters) and
    special tokens anywhere: the streamed text still equals one decode of all of them."""
    rng = random.Random(2)
    vocab = tokenizer.backend_tokenizer.get_vocab_size()
    for _ in range(300):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 8))]
        output = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        sizes = [rng.choice([1, 2, 5]) for _ in output]
        text = _stream(tokenizer, prompt, output, sizes)
        assert text == tokenizer.decode(output, skip_special_tokens=True)


def test_transformers_tokenizers_are_accepted():
    transformers = pytest.importorskip("transformers")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(bundled.TARGET)
    ids = hf_tokenizer.encode(MULTIBYTE, add_special_tokens=False)
    detok = IncrementalDetokenizer(hf_tokenizer, [])
    assert "".join(detok.add([i]) for i in ids) + detok.flush() == MULTIBYTE
    with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
        backend_tokenizer(object())


def test_code_snippets_one_token_at_a_time(tokenizer):
    for snippet in bundled.load_prompts(24):
        ids = tokenizer.encode(snippet, add_special_tokens=False)
        split = len(ids) // 3
        text = _stream(tokenizer, ids[:split], ids[split:], [1] * len(ids))
        assert text == tokenizer.decode(ids[split:], skip_special_tokens=True)


def test_code_snippets_in_random_chunks(tokenizer):
    rng = random.Random(0)
    for snippet in bundled.load_prompts(24):
        ids = tokenizer.encode(snippet, add_special_tokens=False)
        split = rng.randrange(len(ids))
        sizes = [rng.randint(1, 6) for _ in ids]
        text = _stream(tokenizer, ids[:split], ids[split:], sizes)
        assert text == tokenizer.decode(ids[split:], skip_special_tokens=True)


def test_multibyte_characters_split_across_tokens(tokenizer):
    ids = tokenizer.encode(MULTIBYTE, add_special_tokens=False)
    # The premise: this tokenizer really does split characters across tokens.
    assert any(tokenizer.decode([i]).endswith("\ufffd") for i in ids)
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = [detok.add([i]) for i in ids]
    assert "".join(deltas) + detok.flush() == MULTIBYTE
    assert all("\ufffd" not in delta for delta in deltas)


def test_multibyte_after_prompt_ending_mid_character(tokenizer):
    ids = tokenizer.encode("日本語 text", add_special_tokens=False)
    for split in range(1, len(ids)):
        text = _stream(tokenizer, ids[:split], ids[split:], [1] * len(ids))
        assert text == tokenizer.decode(ids[split:], skip_special_tokens=True)


def test_special_tokens_are_skipped(tokenizer):
    ids = tokenizer.encode("x = 1", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, ids)
    text = detok.add(ids) + detok.add([tokenizer.eos_token_id]) + detok.add(ids) + detok.flush()
    assert text == "x = 1x = 1"


def test_flush_returns_incomplete_tail(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.add(ids[:-1]) == ""
    assert detok.flush() == tokenizer.decode(ids[:-1])
    assert detok.flush() == ""


def _feed_all(matcher: StopStringMatcher, deltas: list[str]) -> tuple[str, bool]:
    out = ""
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out += text
        if stopped:
            return out, True
    return out + matcher.flush(), False


def test_stop_string_spanning_deltas():
    matcher = StopStringMatcher(("\ndef ",))
    assert matcher.feed("return x\n") == ("return x", False)  # "\n" may start the stop
    assert matcher.feed("de") == ("", False)
    assert matcher.feed("f foo") == ("", True)
    assert matcher.flush() == ""
    assert matcher.feed("more") == ("", True)


def test_false_start_is_released():
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("OP") == ("", True)
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("ART") == ("START", False)


def test_stop_string_at_the_very_start():
    assert _feed_all(StopStringMatcher(("###",)), ["#", "##", " tail"]) == ("", True)
    assert _feed_all(StopStringMatcher(("###",)), ["### tail"]) == ("", True)


def test_no_stop_flush_returns_the_rest():
    matcher = StopStringMatcher(("</s>", "\n\n"))
    out, stopped = _feed_all(matcher, ["hello ", "wor", "ld\n", "<", "/"])
    assert (out, stopped) == ("hello world\n</", False)


def test_earliest_stop_wins_regardless_of_chunking():
    text = "alpha END beta STOP gamma"
    stops = ("STOP", "END", "gamma")
    for size in range(1, len(text) + 1):
        deltas = [text[i:i + size] for i in range(0, len(text), size)]
        assert _feed_all(StopStringMatcher(stops), deltas) == ("alpha ", True)


def test_overlapping_stops_first_completed_wins():
    # "b" is complete before "abcd" could be, so the stream stops at "a".
    assert _feed_all(StopStringMatcher(("abcd", "b")), ["x a", "bcd"]) == ("x a", True)
    # Both complete together: the one starting first wins.
    assert _feed_all(StopStringMatcher(("cd", "abcd")), ["x ab", "cd"]) == ("x ", True)


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(("",))
