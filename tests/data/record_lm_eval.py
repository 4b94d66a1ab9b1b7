"""Re-record ``tests/data/lm_eval_requests.json`` from a real lm-evaluation-harness run.

Why: ``pytest_gsm8k/presets.py`` claims to send, for ``--gsm8k-preset lm-eval``,
exactly the requests lm-eval sends for its ``gsm8k`` task and to score them
exactly as lm-eval does.  ``tests/unit/core/test_presets.py`` checks that claim against
this fixture without needing lm-eval installed; this script is how the fixture
is made, so anyone can regenerate it (e.g. for a new lm-eval release) and
review the diff.

What it does
------------
1. Starts ``tests/fakeserver.py``'s server in this process with ``record=True``
   and scripted answers (:data:`SCRIPTED`): right, wrong, unparseable, and
   formats where lm-eval's strict-match and flexible-extract disagree.
2. Writes a task YAML that ``include``\\ s lm-eval's own ``gsm8k.yaml`` and only
   swaps the dataset for the local files (the hub is not reachable; row order
   is the same as ``openai/gsm8k``): every prompt, filter and metric setting
   is lm-eval's.
3. Runs the ``lm_eval`` CLI (as a subprocess, exactly as a user would) with
   ``local-completions`` and with ``local-chat-completions
   --apply_chat_template`` (multi-turn, single-turn and with a system
   instruction), plus one full-split completions run to pin the few-shot draws
   of late problems.
4. Saves the request bodies the server received, lm-eval's per-sample logs
   (response, extracted answers, 0/1 scores) and reported metrics, and a table
   of extraction/matching edge cases computed with lm-eval's own
   ``RegexFilter`` and ``exact_match`` functions.

Usage (needs ``pip install "lm-eval[api]==0.4.13"``; no torch, no network)::

    python tests/data/record_lm_eval.py [--data ../shared/gsm8k] \\
        [--out tests/data/lm_eval_requests.json]

It takes under a minute (six lm_eval runs, one of them over the full test split).
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from fakeserver import COMPLETION_TAIL, FakeOpenAIServer, Script  # noqa: E402

MODEL = "fake-model"
TASK = "gsm8k_local"
SYSTEM = "You are a careful math tutor."

#: Problems 0-7 of the test split: what the server answers (before the
#: server's own stop-sequence cut; completions get a leading space and the
#: rambling ``COMPLETION_TAIL`` that the ``Question:`` stop removes).
#: ``None`` = the fake server's own text for the behaviour in :data:`BEHAVIOURS`.
#: Expected lm-eval scores (strict, flexible) in the comments.
SCRIPTED: dict[int, str | None] = {
    0: None,  # correct, "#### 18"                                   (1, 1)
    1: None,  # wrong: "#### 4" for gold 3                           (0, 0)
    2: "He bought it for $80,000 and sold it, so he made a profit of $70,000.",  # (0, 1)
    3: "#### 540\nHe sprints 3 times a week.",  # strict first, flexible last "3"  (1, 0)
    4: "She needs 20 cups.\n#### 20.00",  # "20.00" != "20" for lm-eval    (0, 0)
    5: None,  # unparsed: no digit at all                            (0, 0)
    6: "#### 250\nWait, I forgot the 10 sheep. Corrected:\n#### 260",  # first vs last (0, 1)
    7: "It takes 160 minutes.\n#### 160.",  # trailing period removed  (1, 1)
}
BEHAVIOURS = {0: "correct", 1: "wrong", 5: "unparsed"}

#: Problems of the full-split run whose request bodies are kept (late draws).
FULL_KEEP = (8, 100, 659, 1318)

#: Strings scored by lm-eval's own filter and metric code: (response, gold answer field).
SCORING_CASES: list[tuple[str, str]] = [
    ("#### 18", "So 18.\n#### 18"),
    ("#### 18.", "#### 18"),
    ("#### 18..", "#### 18"),
    ("#### 18.00", "#### 18"),
    ("#### $18", "#### 18"),
    ("The total is $18.", "#### 18"),
    ("The total is $1,800.", "#### 1800"),
    ("#### 1,800", "x\n#### 1,800"),
    ("#### 1800", "x\n#### 1,800"),
    ("#### -3", "#### -3"),
    ("The change is -3 degrees.", "#### -3"),
    ("####18", "#### 18"),
    ("#### 18\n#### 19", "#### 18"),
    ("#### 19\n#### 18", "#### 18"),
    ("The answer is 18...", "#### 18"),
    ("The answer is 18. Done...", "#### 18"),
    ("It is 7 apples.", "#### 7"),
    ("It is 7 apples, 8 pears.", "#### 7"),
    ("<think>maybe 5</think> #### 7", "#### 7"),
    ("<think>#### 5</think> #### 7", "#### 7"),
    ("No idea.", "#### 7"),
    ("", "#### 7"),
    ("#### 0.5", "#### .5"),
    ("#### 007", "#### 7"),
    ("12 + 6 = 18$", "#### 18"),
    ("#### 18\n\n", "#### 18"),
    ("#### 3.5.", "#### 3.5"),
    ("18,", "#### 18"),
    ("The answer: 1.2.3", "#### 123"),
]


class ScriptedServer(FakeOpenAIServer):
    """The fake server with the texts of :data:`SCRIPTED` for some problems."""

    def _generate(self, idx: int | None, chat: bool, sampling: bool) -> tuple[str, str]:
        text = SCRIPTED.get(idx) if idx is not None else None
        if text is None:
            return super()._generate(idx, chat, sampling)
        if chat:
            return text, "stop"
        return " " + text + COMPLETION_TAIL, "length"


def _task_yaml(data: Path) -> str:
    import lm_eval

    gsm8k_yaml = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    return (
        f"include: {gsm8k_yaml}\n"
        f"task: {TASK}\n"
        "tag: []\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    train: {data / 'train.jsonl'}\n"
        f"    test: {data / 'test.jsonl'}\n"
    )


def _run(
    srv: FakeOpenAIServer,
    tmp: Path,
    name: str,
    chat: bool,
    flags: list[str],
    limit: int | None,
) -> dict[str, Any]:
    """One ``lm_eval`` CLI run; returns its bodies, samples and metrics."""
    srv.reset()
    out = tmp / f"out-{name}"
    if chat:
        model = "local-chat-completions"
        model_args = f"model={MODEL},base_url={srv.base_url}/chat/completions,num_concurrent=1"
    else:
        model = "local-completions"
        model_args = (
            f"model={MODEL},base_url={srv.base_url}/completions,num_concurrent=1,"
            "tokenized_requests=False,tokenizer_backend=None"
        )
    shown_args = model_args.replace(srv.base_url, "http://127.0.0.1:<port>/v1")
    argv = ["lm_eval", "--model", model, "--model_args", shown_args, "--tasks", TASK]
    argv += ["--include_path", "<tmp>", "--log_samples", "--output_path", "<out>"]
    if limit is not None:
        argv += ["--limit", str(limit)]
    argv += flags
    real = [sys.executable, "-m", "lm_eval"] + [
        str(tmp)
        if a == "<tmp>"
        else str(out)
        if a == "<out>"
        else model_args
        if a == shown_args
        else a
        for a in argv[1:]
    ]
    env = dict(os.environ)
    env.update(
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp / "hf-datasets"),
        TOKENIZERS_PARALLELISM="false",
    )
    started = time.monotonic()
    proc = subprocess.run(real, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"lm_eval run {name!r} failed with code {proc.returncode}")
    print(f"  {name}: {time.monotonic() - started:.1f}s", file=sys.stderr)

    stats = srv.stats()
    requests = []
    for order, body in enumerate(stats["bodies"]):
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        requests.append({"problem_index": srv.index.find(text), "order": order, "body": body})
    requests.sort(key=lambda r: r["problem_index"])

    (results_file,) = glob.glob(str(out / "*" / "results_*.json"))
    results = json.loads(Path(results_file).read_text())
    task_results = results["results"][TASK]
    metrics = {f: task_results[f"exact_match,{f}"] for f in ("strict-match", "flexible-extract")}
    samples: dict[int, dict[str, Any]] = {}
    (samples_file,) = glob.glob(str(out / "*" / f"samples_{TASK}_*.jsonl"))
    for line in Path(samples_file).read_text(encoding="utf-8").split("\n"):
        if not line.strip():
            continue
        row = json.loads(line)
        doc_id = int(row["doc_id"])
        entry = samples.setdefault(
            doc_id,
            {"problem_index": doc_id, "response": row["resps"][0][0], "target": row["target"]},
        )
        entry.setdefault("extracted", {})[row["filter"]] = row["filtered_resps"][0]
        entry.setdefault("exact_match", {})[row["filter"]] = row["exact_match"]
    return {
        "argv": argv,
        "limit": limit,
        "requests": requests,
        "samples": [samples[k] for k in sorted(samples)],
        "metrics": metrics,
        "n_samples": results["n-samples"][TASK],
        "fewshot_as_multiturn": results.get("fewshot_as_multiturn"),
        "system_instruction": results.get("system_instruction"),
    }


def _lm_eval_dir() -> Path:
    """Where the installed lm-eval lives (its task files are read from there)."""
    import lm_eval

    return Path(lm_eval.__file__).parent


def _scoring_cases() -> list[dict[str, Any]]:
    """Edge cases scored by lm-eval's own RegexFilter and exact_match code."""
    import yaml  # lm-eval depends on PyYAML
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    cfg_path = _lm_eval_dir() / "tasks" / "gsm8k" / "gsm8k.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    filters = {}
    for f in cfg["filter_list"]:
        regex_step = f["filter"][0]
        kwargs = {k: v for k, v in regex_step.items() if k != "function"}
        filters[f["name"]] = RegexFilter(**kwargs)
    metric_kwargs = {
        k: v
        for k, v in cfg["metric_list"][0].items()
        if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")
    }
    cases = []
    for text, gold in SCORING_CASES:
        case: dict[str, Any] = {"response": text, "gold": gold, "extracted": {}, "exact_match": {}}
        for name, flt in filters.items():
            extracted = next(iter(flt.apply([[text]], [{}])))[0]
            score = exact_match_hf_evaluate(
                predictions=[extracted], references=[gold], **metric_kwargs
            )["exact_match"]
            case["extracted"][name] = extracted
            case["exact_match"][name] = float(score)
        cases.append(case)
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "gsm8k")
    ap.add_argument("--out", type=Path, default=HERE / "lm_eval_requests.json")
    args = ap.parse_args(argv)
    data: Path = args.data.resolve()

    version = importlib.metadata.version("lm_eval")
    script = Script(behaviours=dict(BEHAVIOURS))
    srv = ScriptedServer(data / "test.jsonl", model=MODEL, script=script, record=True)
    runs: dict[str, Any] = {}
    with srv, tempfile.TemporaryDirectory(prefix="record-lm-eval-") as tmp_name:
        tmp = Path(tmp_name)
        task_yaml = _task_yaml(data)
        (tmp / f"{TASK}.yaml").write_text(task_yaml)
        print(f"lm-eval {version}, server {srv.base_url}", file=sys.stderr)
        single = ["--apply_chat_template", "--fewshot_as_multiturn", "false"]
        plan: list[tuple[str, bool, list[str], int | None]] = [
            ("completions", False, [], len(SCRIPTED)),
            ("chat", True, ["--apply_chat_template", "--fewshot_as_multiturn"], len(SCRIPTED)),
            ("chat_singleturn", True, single, 3),
            ("completions_system", False, ["--system_instruction", SYSTEM], 2),
            ("chat_system", True, ["--apply_chat_template", "--system_instruction", SYSTEM], 2),
            ("completions_full", False, [], None),
        ]
        for name, chat, flags, limit in plan:
            runs[name] = _run(srv, tmp, name, chat, flags, limit)
    full = runs["completions_full"]
    full["requests"] = [r for r in full["requests"] if r["problem_index"] in FULL_KEEP]
    full["samples"] = [s for s in full["samples"] if s["problem_index"] in FULL_KEEP]

    fixture = {
        "about": (
            "Requests and scores recorded from lm-evaluation-harness against tests/fakeserver.py "
            "by tests/data/record_lm_eval.py; checked by tests/unit/core/test_presets.py."
        ),
        "lm_eval_version": version,
        "environment": {
            "python": platform.python_version(),
            "datasets": importlib.metadata.version("datasets"),
            "numpy": importlib.metadata.version("numpy"),
        },
        "model": MODEL,
        "system_instruction": SYSTEM,
        "task_yaml": task_yaml.replace(str(data), "<data>").replace(
            str(_lm_eval_dir()), "<lm_eval>"
        ),
        "script": {
            "behaviours": {str(k): v for k, v in BEHAVIOURS.items()},
            "texts": {str(k): v for k, v in SCRIPTED.items() if v is not None},
            "completion_tail": COMPLETION_TAIL,
        },
        "runs": runs,
        "scoring_cases": _scoring_cases(),
    }
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    for name, run in runs.items():
        print(f"  {name}: {run['metrics']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
