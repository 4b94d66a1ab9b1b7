"""The net under the end of the run (issue 33 step 0): six scenarios, each run plain and
with ``-n 2`` against the real fake server, whose JSON report, gsm8k terminal block and
Markdown summary must be the same both ways and the same as the golden copies recorded
from the code before the verdict step moved (tests/plugin/golden/acceptance/).

Normalized: times, durations, temporary paths, ports and process ids go, and so do the
fields that say how an answer was fetched (latency, cache) rather than what it was. An
early stop's items in flight past the decision differ by design under xdist (each worker
asks ahead; test_vllm_config_early_stop.py bounds it): for an early-stopped run or config
the plain-versus-xdist comparison keeps what the decision says (the gates, the early-stop
decision, the verdict table's words). The golden copy is the plain run's whole output, but
for a stopped config of a matrix, whose engine's fetched-ahead items run after its stop
even in one process: there it is what the decision says, as between plain and xdist.

``GSM8K_UPDATE_GOLDEN=1`` rewrites the golden copies (only on purpose: a changed golden
file is a changed output, to be read in review).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, config_serve, output

GOLDEN = Path(__file__).parent / "golden" / "acceptance"
UPDATE = os.environ.get("GSM8K_UPDATE_GOLDEN") == "1"
LIMIT = "--gsm8k-limit=20"
#: the subset is seeded, so scripts name problems by a rule on the index: every 7th wrong
#: and every 11th unparsed (a few of 20), every 2nd wrong (about half), the same half flipped
SOME = {i: "wrong" for i in range(0, 1319, 7)} | {i: "unparsed" for i in range(5, 1319, 11)}
HALF = {i: "wrong" for i in range(0, 1319, 2)}
FLIPPED = HALF

#: fields of a record, a report or a block that say how or when, not what
VOLATILE = {
    "started_at",
    "finished_at",
    "duration_s",
    "latency_s",
    "elapsed_s",
    "pid",
    "log",
    "command",
    "cached",
    "startup_seconds",
}


def _scrub(text: str, root: Path) -> str:
    text = text.replace(str(root), "<tmp>")
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    text = re.sub(r"localhost:\d+", "localhost:<port>", text)
    return re.sub(r"/tmp/[^\s\"'`)]*", "<tmp>", text)


def _normal(value: Any, root: Path) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v, root) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_normal(v, root) for v in value]
    if isinstance(value, str):
        return _scrub(value, root)
    return value


def _block(out: str) -> list[str]:
    """The gsm8k section of the terminal, up to pytest's next separator line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^=+ gsm8k =+$", line))
    block = []
    for line in lines[start + 1 :]:
        if re.match(r"^=+ .* =+$", line):
            break
        block.append(line)
    return block


def _decided(report: dict[str, Any]) -> dict[str, Any]:
    """What an early stop decides, without what ran past the decision."""
    keep = ("gates", "early_stop", "expected")

    def part(r: dict[str, Any]) -> dict[str, Any]:
        early = {
            k: v
            for k, v in (r.get("early_stop") or {}).items()
            if k in ("mode", "decided_after", "n_total", "verdicts", "stopped")
        }
        return {**{k: r.get(k) for k in keep}, "early_stop": early}

    return {"run": part(report), "configs": [part(c) for c in report.get("configs", [])]}


def _decided_lines(lines: list[str]) -> list[str]:
    return [
        line
        for line in lines
        if line.lstrip().startswith(("gate ", "early stop", "gsm8k vLLM configs"))
        or line.startswith("|")
    ]


def _run(
    pytester: pytest.Pytester, args: list[str], xdist: list[str], ret: int
) -> tuple[dict[str, Any], list[str], str]:
    for name in ("r.json", "summary.md"):
        (pytester.path / name).unlink(missing_ok=True)
    result = pytester.runpytest(
        *args, "--gsm8k-report=r.json", "--gsm8k-markdown=summary.md", *xdist, *NO_EXTRA_PLUGINS
    )
    out = output(result)
    assert result.ret == ret, out
    root = pytester.path
    report = _normal(json.loads((root / "r.json").read_text(encoding="utf-8")), root)
    block = [_scrub(line, root) for line in _block(result.stdout.str())]
    markdown = _scrub((root / "summary.md").read_text(encoding="utf-8"), root)
    return report, block, markdown


def _configs(folder: Path) -> Path:
    """Two configs: one stopped early (every answer wrong), one run to its end."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, threshold, script in (
        ("Broken-1B", "0.9", '{"default": "wrong"}'),
        ("Tight-7B", "1.0", '{"default": "correct"}'),
    ):
        (folder / f"{name}.yaml").write_text(
            f'model_name: "org/{name}"\naccuracy_threshold: {threshold}\ntolerance: 0.0\n'
            f"num_questions: 20\nnum_fewshot: 0\nenv:\n  FAKESERVER_SCRIPT: '{script}'\n",
            encoding="utf-8",
        )
    return folder


SCENARIOS = ["min_acc_pass", "min_acc_fail", "baseline_flips", "snapshot_update", "deselected"]
SCENARIOS += ["early_stop", "matrix_early"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_plain_and_xdist_give_the_recorded_outputs(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    gsm8k_data: Path,
    tmp_path: Path,
    scenario: str,
) -> None:
    early = scenario in ("early_stop", "matrix_early")
    base = [*gsm8k_args, LIMIT, "--gsm8k-no-cache"]
    health = ["--gsm8k-max-unparsed=0.2"]
    ret = 1
    setup: list[str] | None = None
    if scenario == "min_acc_pass":
        server.set_script(Script(behaviours=SOME))
        args, ret = [*base, "--gsm8k-min-acc=0.6", *health], 0
    elif scenario == "min_acc_fail":
        server.set_script(Script(behaviours=HALF))
        args = [*base, "--gsm8k-min-acc=0.8", *health]
    elif scenario == "baseline_flips":
        setup = [*base, "--snapshot-update"]
        args = base
    elif scenario == "snapshot_update":
        server.set_script(Script(behaviours=SOME))
        args, ret = [*base, "--snapshot-update"], 0
    elif scenario == "deselected":
        args = [*base, "--gsm8k-min-acc=0.5", "-k", "not test-0237 and not test-0417"]
    elif scenario == "early_stop":
        server.set_script(Script(default="wrong"))
        args = [*base, "--gsm8k-min-acc=0.8", "--gsm8k-early-stop=certain", *NO_CACHEPROVIDER]
        args[args.index(LIMIT)] = "--gsm8k-limit=60"
        args += ["--gsm8k-concurrency=2"]
    else:
        folder = _configs(tmp_path / "configs")
        args = [
            f"--gsm8k-config={folder}",
            f"--gsm8k-serve={config_serve(gsm8k_data)}",
            f"--gsm8k-data={gsm8k_data}",
            "--gsm8k-concurrency=2",
            "--gsm8k-no-cache",
            "--gsm8k-early-stop=certain",
            *NO_CACHEPROVIDER,
        ]
    seen = {}
    for mode, xdist in (("plain", []), ("xdist", ["-n", "2"])):
        if setup is not None:
            server.set_script(Script())
            _run(pytester, setup, xdist, 0)
            server.set_script(Script(behaviours=FLIPPED))
        seen[mode] = _run(pytester, args, xdist, ret)
    (plain_json, plain_block, plain_md), (xdist_json, xdist_block, xdist_md) = (
        seen["plain"],
        seen["xdist"],
    )
    if early:
        assert _decided(xdist_json) == _decided(plain_json)
        assert _decided_lines(xdist_block) == _decided_lines(plain_block)
        assert _decided_lines(xdist_md.splitlines()) == _decided_lines(plain_md.splitlines())
    else:
        assert xdist_json == plain_json
        assert xdist_block == plain_block
        assert xdist_md == plain_md
    if scenario == "matrix_early":
        # a config's engine fetches ahead (the concurrency) and the items already fetched
        # still run after its stop, plain too: the stopped config keeps its decision only.
        # Run whole = decided at its last planned problem; how many ran after a stop depends
        # on what was in flight (none, sometimes), so it is not compared.
        whole = [
            c
            for c in plain_json["configs"]
            if c["early_stop"]["decided_after"] == c["early_stop"]["n_total"]
        ]
        plain_json = {"decided": _decided(plain_json), "configs run whole": whole}
        plain_block = _decided_lines(plain_block)
        plain_md = "\n".join(_decided_lines(plain_md.splitlines()))
    files = {
        f"{scenario}.json": json.dumps(plain_json, indent=1, sort_keys=True) + "\n",
        f"{scenario}.txt": "\n".join(plain_block) + "\n",
        f"{scenario}.md": plain_md,
    }
    for name, text in files.items():
        path = GOLDEN / name
        if UPDATE:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        assert text == path.read_text(encoding="utf-8"), f"{name} differs from the golden copy"


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_baseline_write_that_fails_is_the_baseline_gates_fail_and_nothing_says_written(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """The one derived copy of the verdict: the writer runs after the verdict step, and a
    write that fails (here a folder took the file's place after the session-start check)
    turns the baseline gate into a FAIL naming the file and why, in every output."""
    target = Path("__snapshots__") / "gsm8k" / "test@1_0-shot_CoT.gsm8k"
    pytester.makeconftest(
        "from pathlib import Path\n"
        "def pytest_collection_finish(session):\n"
        f"    Path({str(target)!r}).mkdir(parents=True, exist_ok=True)\n"
    )
    report, block, markdown = _run(pytester, [*gsm8k_args, LIMIT, "--snapshot-update"], xdist, 1)
    (gate,) = report["gates"]
    assert (gate["name"], gate["passed"]) == ("baseline", False)
    assert gate["detail"].startswith(f"{target}: cannot write it (")
    assert "baseline" not in report
    assert not any("baseline written" in line for line in block)
    assert f"  gate baseline: FAIL: {target}: cannot write it (" in "\n".join(block)
    assert "| baseline | FAIL |" in markdown
