"""Re-record ``tests/data/vllm_requests.json`` from vLLM's real GSM8K script.

Why: ``--gsm8k-preset vllm`` claims to send, problem by problem, the bytes that vLLM's
``tests/evals/gsm8k/gsm8k_eval.py`` sends and to score the answers with its rule. The tests
(``tests/unit/core/test_engine_ci.py``, ``tests/plugin/test_engine_presets.py``) check that
claim against this fixture without vLLM's script, which is not part of this repository;
this script is how the fixture is made, so anyone can regenerate it from a vLLM checkout
and review the diff.

What it does
------------
1. Starts ``tests/fakeserver.py``'s server in this process with ``record=True`` (it keeps
   every request body's bytes as received) and scripted answers (:data:`SCRIPTED`):
   right, wrong, no digit, and texts where vLLM's last-integer rule and ours differ.
2. Runs the real script's ``evaluate_gsm8k`` (what vLLM's ``test_gsm8k_correctness.py``
   calls per config) in a subprocess of ``--python`` (an interpreter with aiohttp, numpy,
   regex, requests and tqdm: the script's imports), with the GSM8K files placed where the
   script caches its downloads (``tempfile.gettempdir()``), so nothing is downloaded.
   ``vllm.assets.base`` (one URL constant) is stubbed when vLLM is not installed. The
   script's own request functions are wrapped only to note each answer text they return.
3. Saves the raw request bodies, the answers, the script's accuracy and invalid rate per
   run, a hash of all 1,319 bodies of a full run, the script's labels for the test split,
   and its ``get_answer_value`` on edge cases (:data:`SCORING_CASES`).

Usage (no network, no GPU, under a minute)::

    python tests/data/record_vllm.py --script ../vllm/tests/evals/gsm8k/gsm8k_eval.py \\
        --python /path/to/venv-with-aiohttp/bin/python [--source "gsm8k_eval.py @ COMMIT"]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))

from fakeserver import COMPLETION_TAIL, FakeOpenAIServer, Script  # noqa: E402
from gsm8k_copy import data_dir  # noqa: E402

#: Problems 0-7 of the test split: what the server answers (completions get a leading
#: space and the rambling ``COMPLETION_TAIL`` that the ``Question`` stop removes).
#: ``None``: the fake server's own text for :data:`BEHAVIOURS`. vLLM's verdict in comments.
SCRIPTED: dict[int, str | None] = {
    0: None,  # "#### 18": correct
    1: None,  # wrong: "#### 4" for gold 3
    2: "He bought it for $80,000 and sold it, so he made a profit of $70,000.",  # 70000: right
    3: "#### 540\nHe sprints 3 times a week.",  # last integer 3: wrong
    4: "She needs 20 cups.\n#### 20.00",  # last integer "00" = 0: wrong
    5: None,  # no digit at all: invalid
    6: "The flock has 0260 sheep.",  # "0260" is no Python literal: invalid
    7: "It takes 160 minutes.\n#### 160.",  # right
}
BEHAVIOURS = {0: "correct", 1: "wrong", 5: "unparsed"}

#: Problems of the full run whose bodies are kept whole (late problems too).
FULL_KEEP = (8, 100, 659, 1318)

#: Responses scored by the script's own ``get_answer_value``.
SCORING_CASES: list[str] = [
    "#### 18",
    "The answer is 1,800.",
    "1,2,3",
    "-3 degrees",
    "3.5 hours",
    "#### 007",
    "#### 00",
    "#### 0",
    "<think>7</think> the answer is 5",
    "the answer is 5 <think>7",
    "\u0661\u0662 apples",  # Arabic-Indic digits: matched by \d, not a Python literal
    "12\u0663",
    "\uff11\uff12",  # fullwidth digits
    "No idea.",
    "",
    "1" * 5000,
    "x" + "9" * 4300 + " y",
    "$1,000,000.50",
    "18.",
    "2 + 2 = 4, so 4",
]

#: (run name, evaluate_gsm8k keyword arguments besides host and port). The first three
#: are what vLLM's test passes (num_questions, num_shots) and its chat mode.
RUNS: list[tuple[str, dict[str, Any]]] = [
    ("completions", {"num_questions": len(SCRIPTED), "num_shots": 5}),
    ("chat", {"num_questions": len(SCRIPTED), "num_shots": 5, "use_chat_completions": True}),
    ("completions_3shot", {"num_questions": 3, "num_shots": 3}),
    ("completions_0shot", {"num_questions": 2, "num_shots": 0}),
    (
        "chat_params",
        {
            "num_questions": 2,
            "num_shots": 5,
            "use_chat_completions": True,
            "top_p": 0.95,
            "top_k": 20,
            "reasoning_effort": "low",
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ),
    ("completions_params", {"num_questions": 2, "num_shots": 5, "top_p": 1.0, "top_k": 1}),
    ("completions_full", {"num_questions": 1319, "num_shots": 5}),
]

#: Runs in the subprocess: the script's evaluate_gsm8k, its answers noted as they return.
RUNNER = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import gsm8k_eval as m
job = json.loads(open(sys.argv[3]).read())
out = {}
if job["mode"] == "evaluate":
    answers = []
    def spy(orig):
        async def wrapped(*args, **kwargs):
            result = await orig(*args, **kwargs)
            answers.append({"prompt": kwargs["prompt"], "text": result[0]})
            return result
        return wrapped
    m.call_vllm_api = spy(m.call_vllm_api)
    m.call_vllm_chat_api = spy(m.call_vllm_chat_api)
    result = m.evaluate_gsm8k(**job["kwargs"])
    out = {"answers": answers, "accuracy": float(result["accuracy"]),
           "invalid_rate": float(result["invalid_rate"])}
else:
    train, test = m.load_gsm8k_data()
    out = {"labels": [m.get_answer_value(row["answer"]) for row in test],
           "cases": [m.get_answer_value(text) for text in job["cases"]]}
open(sys.argv[4], "w").write(json.dumps(out))
"""


class ScriptedServer(FakeOpenAIServer):
    """The fake server with the texts of :data:`SCRIPTED` for some problems."""

    def _generate(self, idx: int | None, chat: bool, sampling: bool) -> tuple[str, str]:
        text = SCRIPTED.get(idx) if idx is not None else None
        if text is None:
            return super()._generate(idx, chat, sampling)
        if chat:
            return text, "stop"
        return " " + text + COMPLETION_TAIL, "length"


def _call(python: str, script_dir: Path, stub: Path, tmp: Path, job: dict[str, Any]) -> Any:
    """One subprocess run of :data:`RUNNER`; its JSON answer."""
    job_file, out_file = tmp / "job.json", tmp / "out.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ, TMPDIR=str(tmp / "cache"), TQDM_DISABLE="1")
    argv = [python, "-c", RUNNER, str(script_dir), str(stub), str(job_file), str(out_file)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"gsm8k_eval.py run failed with code {proc.returncode}")
    return json.loads(out_file.read_text())


def _stub(tmp: Path) -> Path:
    """A folder with ``vllm/assets/base.py`` defining the one name the script imports."""
    root = tmp / "stub"
    (root / "vllm" / "assets").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "assets" / "__init__.py").write_text("")
    (root / "vllm" / "assets" / "base.py").write_text(
        'VLLM_S3_BUCKET_URL = "https://unreachable.invalid"  # files are pre-placed\n'
    )
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--script", type=Path, required=True, help="vLLM's gsm8k_eval.py")
    ap.add_argument("--python", default=sys.executable, help="interpreter with its imports")
    ap.add_argument("--source", default="", help="where the script came from (file, commit)")
    ap.add_argument("--data", type=Path, default=None, help="folder with test/train.jsonl")
    ap.add_argument("--out", type=Path, default=HERE / "vllm_requests.json")
    args = ap.parse_args(argv)
    data: Path = (args.data or data_dir()).resolve()
    script_text = args.script.read_text(encoding="utf-8")

    runs: dict[str, Any] = {}
    srv = ScriptedServer(
        data / "test.jsonl",
        model="served-model",
        script=Script(behaviours=dict(BEHAVIOURS)),
        record=True,
    )
    with srv, tempfile.TemporaryDirectory(prefix="record-vllm-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "cache").mkdir()
        for name in ("train.jsonl", "test.jsonl"):
            shutil.copyfile(data / name, tmp / "cache" / name)
        stub = _stub(tmp)
        host, port = srv.base_url.removesuffix("/v1").rsplit(":", 1)
        for name, kwargs in RUNS:
            srv.reset()
            out = _call(
                args.python,
                args.script.resolve().parent,
                stub,
                tmp,
                {"mode": "evaluate", "kwargs": {**kwargs, "host": host, "port": int(port)}},
            )
            raws: list[str] = srv.stats()["raw_bodies"]
            requests: list[dict[str, Any]] = []
            for raw in raws:
                body = json.loads(raw)
                text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
                requests.append({"problem_index": srv.index.find(text), "raw": raw})
            requests.sort(key=lambda r: int(r["problem_index"]))
            answers: dict[int, str] = {}
            for answer in out["answers"]:
                index = srv.index.find(answer["prompt"])
                assert index is not None, "an answer to no known problem"
                answers[index] = answer["text"]
            run: dict[str, Any] = {
                "kwargs": kwargs,
                "accuracy": out["accuracy"],
                "invalid_rate": out["invalid_rate"],
            }
            if name == "completions_full":
                joined = "\n".join(r["raw"] for r in requests).encode("utf-8")
                run["n_requests"] = len(requests)
                run["sha256"] = hashlib.sha256(joined).hexdigest()
                requests = [r for r in requests if r["problem_index"] in FULL_KEEP]
            else:
                run["answers"] = [{"problem_index": k, "text": answers[k]} for k in sorted(answers)]
            run["requests"] = requests
            runs[name] = run
            print(f"  {name}: {len(raws)} requests, accuracy {out['accuracy']}", file=sys.stderr)
        scored = _call(
            args.python,
            args.script.resolve().parent,
            stub,
            tmp,
            {"mode": "score", "cases": SCORING_CASES},
        )

    fixture = {
        "about": (
            "Request bodies (bytes as received), answers and scores recorded from vLLM's "
            "tests/evals/gsm8k/gsm8k_eval.py against tests/fakeserver.py by "
            "tests/data/record_vllm.py; checked by tests/unit/core/test_engine_ci.py and "
            "tests/plugin/test_engine_presets.py."
        ),
        "source": args.source,
        "script_sha256": hashlib.sha256(script_text.encode("utf-8")).hexdigest(),
        "environment": {"python": platform.python_version()},
        "script": {
            "behaviours": {str(k): v for k, v in BEHAVIOURS.items()},
            "texts": {str(k): v for k, v in SCRIPTED.items() if v is not None},
            "completion_tail": COMPLETION_TAIL,
        },
        "runs": runs,
        "labels": scored["labels"],
        "scoring_cases": [
            {"text": text, "value": value}
            for text, value in zip(SCORING_CASES, scored["cases"], strict=True)
        ],
    }
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
