"""Scrubbing secrets and making text printable: keys and URL credentials, secret options in
command lines, invisible and reordering characters, Markdown and terminal text."""

from __future__ import annotations

import time

import pytest
from helpers import TEST_KEY

from pytest_gsm8k.core import scrub as scrubbing
from pytest_gsm8k.core.scrub import REDACTED, Scrubber, md_code, md_text, printable, shown_url


def test_printable_escapes_invisible_reordering_and_keeps_joiners() -> None:
    assert printable("a\u202eb") == "a\\u202eb"
    for char in "\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c\ufeff":
        assert printable(f"x{char}y") == f"x\\u{ord(char):04x}y"
    assert printable("line\u2028sep\u2029") == "line\\u2028sep\\u2029"
    assert printable("zero\u200bwidth") == "zero\\u200bwidth"
    assert printable("tag\U000e0041") == "tag\\U000e0041"
    assert printable("lone \ud83d") == "lone \\ud83d"  # could not even be encoded
    assert printable("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") == (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # Persian needs its ZWNJ
    )
    assert printable("caf\u00e9 \u2014 \U0001f600") == "caf\u00e9 \u2014 \U0001f600"
    assert printable("a\x1b[31mb\x1b]0;title\x07c\x00d\ne") == "abcd e"


def test_command_lines_lose_secret_option_values_but_keep_variable_names() -> None:
    scrub = Scrubber(TEST_KEY, None, ())
    assert scrub.command(f"vllm serve m --api-key {TEST_KEY} --port {{port}}") == (
        f"vllm serve m --api-key {REDACTED} --port {{port}}"
    )
    assert scrubbing.redact_options(
        "x --api-key=abc HF_TOKEN=hf_abc --hf-token 'a b' --token=t"
    ) == (f"x --api-key={REDACTED} HF_TOKEN={REDACTED} --hf-token {REDACTED} --token={REDACTED}")
    kept = 'x --api-key $OPENAI_API_KEY --password "${PW}" --max-tokens 5 --tokenizer t'
    assert scrubbing.redact_options(kept) == kept


def test_scrubber_removes_keys_and_url_credentials() -> None:
    scrub = Scrubber("sk-abcdef123", "https://bob:s3cr%40t-pass@host/v1", ())
    assert scrub.text("Bearer sk-abcdef123!") == "Bearer [redacted]!"
    assert scrub.text("https://bob:s3cr%40t-pass@host/v1") == "https://host/v1"
    assert "s3cr@t-pass" not in scrub.text("pw s3cr@t-pass")
    assert scrub.obj({"a": ["sk-abcdef123"]}) == {"a": ["[redacted]"]}
    assert not Scrubber("ab", None, ())  # a 2-character key would corrupt answers: not scrubbed
    assert Scrubber(None, None, ()).text("18") == "18"


def test_credentials_of_a_url_urlsplit_refuses_are_still_scrubbed() -> None:
    """``$OPENAI_BASE_URL=http://u:p@[::1`` (a bracket left open) made urlsplit raise in the
    scrubber: an INTERNALERROR before the preflight's one line; its password stays a secret."""
    scrub = Scrubber(None, "http://bob:hunter2-pass@[::1/v1", ())
    assert (
        scrub.text("http://bob:hunter2-pass@[::1/v1 and hunter2-pass")
        == "http://[::1/v1 and [redacted]"
    )


def test_a_message_cut_inside_a_key_loses_the_keys_first_characters_answers_keep_theirs() -> None:
    """A message's excerpt of a reply is cut to a bound before the scrubber sees it: ``cut``
    hides a tail that begins a secret (MIN_SECRET characters or more); an answer (not cut)
    ending so keeps its text, its end is what is graded."""
    scrub = Scrubber(TEST_KEY, None, ())
    said = "the endpoint's reply is not JSON: <<Bearer " + TEST_KEY[:10]
    assert scrub.text(said, cut=True) == f"the endpoint's reply is not JSON: <<Bearer {REDACTED}"
    assert scrub.text(said) == said
    short = "ends with " + TEST_KEY[: scrubbing.MIN_SECRET - 1]  # too short a part to hide
    assert scrub.text(short, cut=True) == short
    assert scrub.text(f"{TEST_KEY} and {TEST_KEY[:8]}", cut=True) == f"{REDACTED} and {REDACTED}"


def test_markdown_and_terminal_helpers() -> None:
    assert printable("a\x1b[31mb\x1b]0;title\x07c\x00d\ne") == "abcd e"
    assert md_code("a`b") == "``a`b``"
    assert md_text("x|y *z* <b>") == "x\\|y \\*z\\* \\<b\\>"


def test_a_commands_secret_values_are_found_and_replaced_word_by_word() -> None:
    """Rule: a secret given to a server (``--api-key X``, ``--api-key=X``, ``HF_TOKEN=X``)
    is a secret of the run: the server prints its arguments, so the value is scrubbed from
    everything, and the arguments are stored with it replaced."""
    words = ["--api-key", "k-spaced", "--hf-token=k-joined", "HF_TOKEN=k-env", "--max-tokens", "5"]
    shown, values = scrubbing.secret_args([*words, "--api-key", "$OPENAI_API_KEY"])
    assert values == ["k-spaced", "k-joined", "k-env"]
    assert shown == [
        "--api-key",
        REDACTED,
        f"--hf-token={REDACTED}",
        f"HF_TOKEN={REDACTED}",
        "--max-tokens",
        "5",
        "--api-key",
        "$OPENAI_API_KEY",
    ]
    assert scrubbing.command_secrets("vllm serve m --api-key 'a b c' --port {port}") == ["a b c"]
    assert scrubbing.command_secrets("unbalanced 'quote --api-key=abcdef") == ["abcdef"]
    env = [("HF_TOKEN", "plain-value"), ("MY_CRED", "sk-abcdef123456"), ("MODEL", "org/m-8B")]
    assert scrubbing.secret_env(env) == ["plain-value", "sk-abcdef123456"]
    scrub = Scrubber(None, None, ["k-spaced-long", "short"])
    assert scrub.text("x k-spaced-long a=short") == f"x {REDACTED} a=short"  # 5 < MIN_SECRET
    assert scrub.words(["a=k-spaced-long", "--api-key", "abc"]) == [
        f"a={REDACTED}",
        "--api-key",
        REDACTED,
    ]


def test_url_passwords_secret_named_options_and_json_keys_are_hidden_and_collected() -> None:
    """Rule: a secret given to a server in any of its shapes never reaches a report, the
    terminal or a log: a URL's password (``scheme://user:PASSWORD@host``), the value of an
    option whose name holds a secret word anywhere (``--secret-key X``; a file option such
    as ``--hf-token-file`` names a path, not a secret), and the value of a secret-named key
    inside a JSON or ``k=v`` argument. The values are collected as the run's secrets too."""
    command = (
        "VLLM_API_KEY=S1 serve.sh {port} {model} --api-key=S2 --x https://u:SECRETPPP000@h/ "
        '--secret-key SECRETQQQ000 --hf-overrides \'{"hf_token":"SECRETSSS000"}\' '
        "--lora-modules a=https://user:SECRETDDD444@example.com/x --y a=1,token=SECRETKV0001 "
        "--hf-token-file /run/tok --return-tokens-as-token-ids --max-tokens 5"
    )
    secrets = ["SECRETPPP000", "SECRETQQQ000", "SECRETSSS000", "SECRETDDD444", "SECRETKV0001"]
    shown = scrubbing.redact_options(command)
    for secret in secrets:
        assert secret not in shown, shown
    assert "https://u:[redacted]@h/" in shown
    assert '{"hf_token":"[redacted]"}' in shown
    assert "--hf-token-file /run/tok --return-tokens-as-token-ids --max-tokens 5" in shown
    found = scrubbing.command_secrets(command)
    assert set(secrets) <= set(found), found
    assert "/run/tok" not in found
    words = ["--hf-overrides", '{"token": "SECRETEEE555", "max_tokens": 9}', "--x", "a=b"]
    shown_words, values = scrubbing.secret_args(words)
    assert values == ["SECRETEEE555"]
    assert shown_words[1] == '{"token": "[redacted]", "max_tokens": 9}'
    assert scrubbing.secret_env([("AWS_SECRET_ACCESS_KEY", "plain-value")]) == ["plain-value"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("http://alice:pw@host:8000/v1", "http://host:8000/v1"),
        ("http://alice:pw@[::1]:8000/v1", "http://[::1]:8000/v1"),  # IPv6 keeps its brackets
        ("http://[fe80::1]/v1", "http://[fe80::1]/v1"),
        ("https://api.example.com/v1?api-key=sk-q-ABC#frag", "https://api.example.com/v1"),
        ("https://u:p@api.example.com/v1?x=1", "https://api.example.com/v1"),
        (" http://host/v1 ", "http://host/v1"),
        ("not a url?key=1", "not a url"),
        ("http://[::1/v1", "(unparseable URL)"),
    ],
)
def test_a_url_is_shown_without_credentials_query_or_fragment(url: str, shown: str) -> None:
    """One rule for every URL the plugin prints or stores (reports, the page, error lines):
    a secret can hide in the user info or the query string (``?api-key=``), so both go; an
    IPv6 host keeps its brackets, the port and path stay as written."""
    assert shown_url(url) == shown


@pytest.mark.parametrize(
    "text",
    [
        "see https://user:pa:ss@host/x",  # the password is all after the first colon
        "1https://user:pa:ss@host/x",  # a scheme right after a digit
        "git+ssh://user:pa:ss@host/",
    ],
)
def test_a_url_password_is_hidden_whole(text: str) -> None:
    shown, found = scrubbing.secret_args([text])
    assert shown == [text.replace("pa:ss", REDACTED)]
    assert found == ["pa:ss"]


@pytest.mark.parametrize("text", [".a" * 50_000, "x://" + "a:" * 50_000])
def test_hostile_text_is_scrubbed_in_one_pass_not_per_character(text: str) -> None:
    """A server's output is scrubbed before it is shown: on these 100 kB the URL pattern once
    tried the rest of the text at every character (minutes); now a fraction of a second, this
    bound only catches that return."""
    start = time.perf_counter()
    assert scrubbing.redact_options(text) == text
    assert time.perf_counter() - start < 5.0
