"""Your own test over every GSM8K problem: the plugin parametrizes ``gsm8k_problem``.

``gsm8k_outcome`` is the scored answer. A wrong answer is a measurement: this
test passes either way, and the session summary (and ``--gsm8k-min-acc``)
decides whether the run fails.
"""


def test_my_model(gsm8k_problem, gsm8k_outcome):
    assert gsm8k_outcome.outcome in ("correct", "wrong", "unparsed", "truncated")
