"""The protocol's identity: what makes two runs' numbers comparable."""

from __future__ import annotations

import hashlib

from pytest_gsm8k.core.prompts import Protocol


def test_a_system_text_utf8_cannot_hold_is_hashed_not_an_internal_error() -> None:
    """``--gsm8k-system`` with a byte the locale does not decode reaches Python's argv as a lone
    surrogate (``\\udcff``): the baseline and the report were an INTERNALERROR after every
    answer was in. It is hashed like any text, apart from its neighbours; a UTF-8 text's hash
    is the one baselines recorded before hold."""
    brief = Protocol(system="Be brief.").identity()["system_hash"]
    assert brief == hashlib.sha256(b"Be brief.").hexdigest()[:16]
    odd = Protocol(system="Be brief.\udcff").identity()["system_hash"]
    assert len(odd) == 16
    assert odd not in (brief, Protocol(system="Be brief.\udcfe").identity()["system_hash"])


def test_the_exemplars_hash_is_the_one_recorded_baselines_hold() -> None:
    """The pool's pairs joined as question ``\\x01`` answer, ``\\x00`` between pairs: a change
    here would make every baseline recorded with shots refuse the run as another protocol."""
    pairs = (("q1", "a #### 1"), ("q2", "a #### 2"))
    expected = hashlib.sha256(b"q1\x01a #### 1\x00q2\x01a #### 2").hexdigest()[:16]
    assert Protocol(shots=2, exemplars=pairs).identity()["fewshot_hash"] == expected
    assert Protocol(shots=2, train=pairs).identity()["fewshot_hash"] == expected
    assert Protocol().identity()["fewshot_hash"] is None
    assert Protocol(system="").identity()["system_hash"] is None
