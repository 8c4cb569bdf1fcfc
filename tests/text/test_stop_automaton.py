"""The stop-string automaton against brute force: normalization (drop a stop string that
contains another) and every occurrence of every pattern."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.api.requests.params import normalize_stop
from kiln.engine.output_processor import StopChecker
from kiln.text.stop_automaton import StopAutomaton

WORDS = st.text(alphabet="abc", min_size=1, max_size=5)


def brute_normalize(items: list[str]) -> tuple[str, ...]:
    unique = sorted(set(items))
    return tuple(s for s in unique if not any(o != s and o in s for o in unique))


@settings(max_examples=400, deadline=None)
@given(items=st.lists(WORDS, min_size=1, max_size=8))
def test_normalize_drops_exactly_the_strings_that_contain_another(items: list[str]) -> None:
    assert normalize_stop(items) == brute_normalize(items)


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(WORDS, min_size=1, max_size=6), text=st.text(alphabet="abcd", max_size=30))
def test_every_occurrence_is_reported_where_it_ends(patterns: list[str], text: str) -> None:
    ac = StopAutomaton(patterns)
    state, found = 0, set()
    for end, ch in enumerate(text, start=1):
        state = ac.step(state, ch)
        found |= {(end, ac.patterns[m]) for m in ac.matches_at(state)}
        # the state is the longest suffix of the text so far that is a prefix of a pattern
        depth = max((n for n in range(end + 1)
                     if any(p.startswith(text[end - n:end]) for p in ac.patterns)), default=0)
        assert ac.depth[state] == depth
    want = {(e, p) for p in ac.patterns for e in range(len(p), len(text) + 1)
            if text[e - len(p):e] == p}
    assert found == want


class OneChar:
    def __init__(self, text: str) -> None:
        self.text = text

    def push(self, token_id: int) -> str:
        return self.text[token_id]

    def flush(self) -> str:
        return ""


def test_twenty_thousand_stop_strings() -> None:
    """20,000 stop strings normalize and match as a few do (the pairwise normalization and the
    per-string scan per token that this replaced took ~18 s and 17 ms a token here)."""
    stops = [f"zq{i:05d}" for i in range(20_000)]
    kept = normalize_stop(stops)
    assert len(kept) == 20_000
    text = "a zq0 word zq1999 then zq12345 end"
    checker = StopChecker(OneChar(text), kept)
    out = ""
    for i in range(len(text)):
        delta, stop = checker.push(i)
        out += delta
        if stop is not None:
            break
    assert (out, stop) == ("a zq0 word zq1999 then ", "zq12345")
