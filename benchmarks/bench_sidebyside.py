"""Benchmark: pytest-gsm8k side by side with vLLM's GSM8K script and lm-eval, one machine.

Not a test. Run from the repository root::

    python benchmarks/bench_sidebyside.py                 # 1,319 problems, 3 rounds
    python benchmarks/bench_sidebyside.py --problems 20 --rounds 1 --no-warmup

Each run (vLLM's own ``gsm8k_eval.py``, the plugin with ``--gsm8k-preset=vllm`` plain and
``-n 2``, lm-eval's ``local-completions``) goes against the same fake server
(``tests/fakeserver.py``, 200 ms a request) at concurrency 64, interleaved round by round after
an untimed warm-up; it reports wall time, the process tree's CPU and peak RSS, the server's
request count and each tool's accuracy. Targets (full split): the plugin within 1.10x the
script, and faster than lm-eval; exit code 1 on a miss or a wrong request count, 2 when a tool
is missing (``--skip`` leaves it out). What each run does, where the tools live and how to get
them: benchmarks/README.md, "Side by side with vLLM's script and lm-eval".
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
from bench_plugin import _post, run_measured, server_counts  # noqa: E402
from gsm8k_copy import data_dir  # noqa: E402

MODEL = "fake-model"
BENCH_DIR = Path.home() / ".cache" / "pytest-gsm8k" / "bench"

#: the vLLM commit whose ``tests/evals/gsm8k/gsm8k_eval.py`` this bench runs, and that
#: file's git blob hash (``git hash-object``), checked before it runs
VLLM_COMMIT = "03e09605209f4dc33df2e3be7b24c05f0e3142cb"
VLLM_BLOB = "d8e71ea4e39d444d795b94796ed38f95c0497087"
VLLM_PATH = "tests/evals/gsm8k/gsm8k_eval.py"
HOW_TO_GET_SCRIPT = (
    f"curl -fsSLo {{path}} https://raw.githubusercontent.com/vllm-project/vllm/{VLLM_COMMIT}/"
    f"{VLLM_PATH}  (or: git -C <a vllm clone> show {VLLM_COMMIT}:{VLLM_PATH} > {{path}})"
)
HOW_TO_GET_VENV = (
    'python3 -m venv {venv} && {venv}/bin/pip install "lm-eval[api]==0.4.13"  '
    "(lm-eval and the vLLM script's imports: aiohttp numpy regex requests tqdm)"
)
#: the stand-in for the one vLLM import the script has: the bucket its data would come from
#: (never reached: the data files are already where it looks)
VLLM_STUB = 'VLLM_S3_BUCKET_URL = "http://127.0.0.1:9/unreachable"\n'
RUNS = ("vllm script", "plugin", "plugin -n 2", "lm-eval")
#: runs not in the default set (none at present: a candidate change's "before" goes here, so
#: that it is measured in the same process tree as the "after")
EXTRA_RUNS: tuple[str, ...] = ()


def git_blob_hash(data: bytes) -> str:
    """What ``git hash-object`` prints for a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_vllm_script(path: Path) -> str | None:
    """None when ``path`` is the pinned script, else one line saying what is wrong."""
    if not path.is_file():
        return f"vLLM's script is not at {path}: " + HOW_TO_GET_SCRIPT.format(path=path)
    got = git_blob_hash(path.read_bytes())
    if got != VLLM_BLOB:
        return (
            f"{path} is not vLLM's {VLLM_PATH} at {VLLM_COMMIT[:12]} (git blob {got[:12]}, "
            f"expected {VLLM_BLOB[:12]}): " + HOW_TO_GET_SCRIPT.format(path=path)
        )
    return None


def check_venv(venv: Path, module: str) -> str | None:
    """None when the bench virtualenv has ``module``, else one line saying how to make it."""
    python = venv / "bin" / "python"
    how = HOW_TO_GET_VENV.format(venv=venv)
    if not python.exists():
        return f"no virtualenv at {venv}: {how}"
    site = list((venv / "lib").glob(f"python*/site-packages/{module}"))
    if not site:
        return f"{venv} has no {module}: {how}"
    return None


# ---------------------------------------------------------------------------- the commands


@dataclass
class Setup:
    """What every run of one bench needs: the server, the data, the folders."""

    base_url: str
    data: Path  # train.jsonl and test.jsonl, the embedded copy as files
    problems: int  # the first N, or (the plugin) a seeded subset of N
    full: int  # problems in the test split
    concurrency: int
    work: Path
    venv: Path
    vllm_script: Path
    plugin_args: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.base_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def vllm_command(setup: Setup) -> tuple[list[str], dict[str, str]]:
    """vLLM's script as its CI runs it, and the environment that keeps it off the network."""
    stub = setup.work / "vllm-stub" / "vllm" / "assets"
    stub.mkdir(parents=True, exist_ok=True)
    for folder in (stub.parent, stub):
        (folder / "__init__.py").touch()
    (stub / "base.py").write_text(VLLM_STUB)
    argv = [
        str(setup.venv / "bin" / "python"),
        str(setup.vllm_script),
        "--host",
        "http://127.0.0.1",
        "--port",
        str(setup.port),
        "--num-questions",
        str(setup.problems),
        "--max-concurrency",
        str(setup.concurrency),
    ]
    # the script reads $TMPDIR/train.jsonl and $TMPDIR/test.jsonl when they exist
    return argv, {"PYTHONPATH": str(stub.parent.parent), "TMPDIR": str(setup.data)}


def plugin_command(setup: Setup, xdist: bool) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        f"--gsm8k-model={MODEL}",
        f"--gsm8k-base-url={setup.base_url}",
        f"--gsm8k-concurrency={setup.concurrency}",
        "--gsm8k-no-cache",
        "-p",
        "no:cacheprovider",
    ]
    if setup.problems < setup.full:
        # the plugin refuses a cut split: a seeded subset of the same size instead
        argv.append(f"--gsm8k-limit={setup.problems}")
    # the vllm preset: the script's requests byte for byte (docs/protocols.md)
    argv += setup.plugin_args or ["--gsm8k-preset=vllm"]
    return [*argv, "-n", "2"] if xdist else argv


def lm_eval_command(setup: Setup) -> tuple[list[str], dict[str, str]]:
    """lm-eval's own gsm8k task (5-shot) through ``local-completions``, offline."""
    import_dir = setup.work / "lm-eval-task"
    import_dir.mkdir(exist_ok=True)
    gsm8k_yaml = next((setup.venv / "lib").glob("python*/site-packages/lm_eval/tasks/gsm8k"))
    (import_dir / "gsm8k_local.yaml").write_text(
        f"include: {gsm8k_yaml / 'gsm8k.yaml'}\n"
        "task: gsm8k_local\n"
        "tag: []\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    train: {setup.data / 'train.jsonl'}\n"
        f"    test: {setup.data / 'test.jsonl'}\n"
    )
    model_args = (
        f"model={MODEL},base_url={setup.base_url}/completions,"
        f"num_concurrent={setup.concurrency},tokenized_requests=False,tokenizer_backend=None"
    )
    argv = [
        str(setup.venv / "bin" / "python"),
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        "gsm8k_local",
        "--include_path",
        str(import_dir),
    ]
    if setup.problems < setup.full:
        argv += ["--limit", str(setup.problems)]
    env = {
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(setup.work / "hf-datasets"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    return argv, env


#: the accuracy each tool prints, found in its output
ACCURACY = {
    "vllm script": re.compile(r"^Accuracy: ([\d.]+)", re.M),
    "plugin": re.compile(r"gsm8k acc \([^)]*\) = ([\d.]+)"),
    "lm-eval": re.compile(r"strict-match\s*\|\s*5\|exact_match\|[^|]*\|\s*([\d.]+)"),
}


def accuracy(name: str, text: str) -> str:
    pattern = ACCURACY["plugin" if name.startswith("plugin") else name]
    found = pattern.findall(text)
    return f"{float(found[-1]):.3f}" if found else "?"


# ---------------------------------------------------------------------------- running


def write_data(folder: Path) -> int:
    """train.jsonl and test.jsonl (the embedded copy) in ``folder``; returns how many problems
    test.jsonl holds."""
    source = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "test.jsonl"):
        (folder / name).write_bytes((source / name).read_bytes())
    text = (folder / "test.jsonl").read_text(encoding="utf-8")
    return sum(1 for line in text.splitlines() if line.strip())


def commands(setup: Setup, runs: list[str]) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    for name in runs:
        if name == "vllm script":
            argv, env = vllm_command(setup)
            yield name, argv, env
        elif name == "plugin":
            yield name, plugin_command(setup, xdist=False), {}
        elif name == "plugin -n 2":
            yield name, plugin_command(setup, xdist=True), {}
        else:
            argv, env = lm_eval_command(setup)
            yield name, argv, env


def bench(setup: Setup, runs: list[str], rounds: int, warmup: bool, latency: float) -> Any:
    from fakeserver import serve_in_subprocess, stop_subprocess

    proc, base_url = serve_in_subprocess(setup.data / "test.jsonl", latency=latency, model=MODEL)
    setup.base_url = base_url
    root = base_url.rsplit("/v1", 1)[0]
    env = dict(os.environ)
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "OPENAI_BASE_URL", "PYTHONPATH"):
        env.pop(name, None)
    env["OPENAI_API_KEY"] = "EMPTY"
    # a user's machine caches bytecode; this sandbox may not (see bench_plugin.py)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(setup.work / "pycache")
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for round_ in range(0 if warmup else 1, rounds + 1):
            for name, argv, extra in commands(setup, runs):
                cwd = Path(tempfile.mkdtemp(prefix="run-", dir=setup.work))  # empty folder
                log = setup.work / f"{name.replace(' ', '_')}-{round_}.log"
                _post(root + "/_reset")
                measured = run_measured(argv, cwd=cwd, env={**env, **extra}, log=log)
                measured["requests"], measured["worst"] = server_counts(root)
                text = log.read_text(errors="replace")
                measured["acc"] = accuracy(name, text)
                measured["tree_mb"] = sum(kb for _, kb in measured["peaks"].values()) / 1024
                measured["ok"] = measured["rc"] == 0 and measured["acc"] != "?"
                if not measured["ok"]:
                    tail = "\n".join(text.splitlines()[-15:])
                    print(f"!! {name} failed, rc={measured['rc']}:\n{tail}", file=sys.stderr)
                print(
                    f"  round {round_}{' (warm-up)' if round_ == 0 else ''}: {name:<12} "
                    f"{measured['wall']:6.2f} s  CPU {measured.get('cpu', 0.0):5.2f} s  "
                    f"largest process {measured['max_mb']:4.0f} MB  "
                    f"tree {measured['tree_mb']:4.0f} MB  requests {measured['requests']}",
                    file=sys.stderr,
                    flush=True,
                )
                if round_ > 0:
                    results.setdefault(name, []).append(measured)
    finally:
        stop_subprocess(proc)
    return results


def summarize(
    results: dict[str, list[dict[str, Any]]], problems: int, full: int, latency: float, c: int
) -> tuple[str, bool]:
    """The table and the verdicts; ``ok`` is False on a failed run, a wrong request count,
    or (full split only) a missed target."""
    rounds = max((len(r) for r in results.values()), default=0)
    lines = [
        f"{problems} problems, fake server {latency * 1000:.0f} ms per request, concurrency "
        f"{c}; wall: median of {rounds} round(s); peak RSS: max over the rounds",
        "",
        "| run          | wall s | min..max s   | x vLLM | CPU s | peak RSS MB (largest / tree) "
        "| requests | acc   |",
        "|--------------|--------|--------------|--------|-------|------------------------------"
        "|----------|-------|",
    ]
    medians = {name: statistics.median(r["wall"] for r in runs) for name, runs in results.items()}
    ref = medians.get("vllm script")
    ok = True
    for name, runs in results.items():
        walls = [r["wall"] for r in runs]
        exact = all(r["requests"] == problems and r["worst"] == 1 for r in runs)
        ok &= exact and all(r["ok"] for r in runs)
        ratio = f"{medians[name] / ref:6.2f}" if ref else "     -"
        rss = f"{max(r['max_mb'] for r in runs):.0f} / {max(r['tree_mb'] for r in runs):.0f}"
        sent = ",".join(str(n) for n in sorted({r["requests"] for r in runs}))
        accs = ",".join(sorted({r["acc"] for r in runs}))
        cpu = statistics.median(r.get("cpu", 0.0) for r in runs)
        lines.append(
            f"| {name:<12} | {medians[name]:6.2f} | {min(walls):5.2f}..{max(walls):5.2f} | "
            f"{ratio} | {cpu:5.2f} | {rss:>28} | {sent + ('' if exact else ' !'):>8} | "
            f"{accs:<5} |"
        )
    judged = problems == full
    lines += ["", "targets" + ("" if judged else " (judged on the full split only):")]
    for name in ("plugin", "plugin -n 2"):
        if name not in medians:
            continue
        if ref:
            hit = medians[name] <= 1.10 * ref
            ok &= hit or not judged
            lines.append(
                f"  {name}: {medians[name] / ref:.2f}x the vLLM script (target <= 1.10x): "
                f"{'OK' if hit else 'MISS'}"
            )
        if "lm-eval" in medians:
            hit = medians[name] < medians["lm-eval"]
            ok &= hit or not judged
            lines.append(
                f"  {name}: {medians[name]:.2f} s vs lm-eval {medians['lm-eval']:.2f} s "
                f"(target: faster): {'OK' if hit else 'MISS'}"
            )
    lines.append(
        f"  every run: {problems} completion requests, none asked twice: "
        f"{'OK' if all(r['requests'] == problems and r['worst'] == 1 for rs in results.values() for r in rs) else 'MISS'}"  # noqa: E501
    )
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--problems", type=int, default=1319, help="the first N test problems")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per run")
    parser.add_argument("--no-warmup", action="store_true", help="no untimed warm-up round")
    parser.add_argument("--latency", type=float, default=0.2, help="server seconds per request")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight, each")
    parser.add_argument(
        "--vllm-script", type=Path, default=BENCH_DIR / "gsm8k_eval.py", help="vLLM's script"
    )
    parser.add_argument(
        "--venv",
        type=Path,
        default=BENCH_DIR / "lm-eval-venv",
        help="virtualenv with lm-eval and the vLLM script's imports",
    )
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help=f"comma-separated, from: {', '.join((*RUNS, *EXTRA_RUNS))} (default: "
        f"{', '.join(RUNS)})",
    )
    parser.add_argument(
        "--skip", action="store_true", help="leave out a run whose tool is missing (say why)"
    )
    parser.add_argument(
        "--plugin-arg",
        action="append",
        default=[],
        help="replaces the plugin's protocol options (repeatable)",
    )
    opts = parser.parse_args(argv)
    runs = [name.strip() for name in opts.runs.split(",") if name.strip()]
    unknown = [name for name in runs if name not in (*RUNS, *EXTRA_RUNS)]
    if unknown:
        choices = ", ".join((*RUNS, *EXTRA_RUNS))
        parser.error(f"--runs: unknown run {unknown[0]!r} (choose from {choices})")
    missing: dict[str, str] = {}
    for name in runs:
        why = None
        if name == "vllm script":
            why = check_vllm_script(opts.vllm_script) or check_venv(opts.venv, "aiohttp")
        elif name == "lm-eval":
            why = check_venv(opts.venv, "lm_eval")
        if why:
            missing[name] = why
    for name, why in missing.items():
        print(f"bench: {'skipped' if opts.skip else 'cannot run'} {name}: {why}", file=sys.stderr)
    if missing and not opts.skip:
        return 2
    runs = [name for name in runs if name not in missing]
    with tempfile.TemporaryDirectory(prefix="gsm8k-sidebyside-") as tmp:
        work = Path(tmp)
        full = write_data(work / "data")
        problems = min(opts.problems, full)
        setup = Setup(
            base_url="",
            data=work / "data",
            problems=problems,
            full=full,
            concurrency=opts.concurrency,
            work=work,
            venv=opts.venv,
            vllm_script=opts.vllm_script,
            plugin_args=opts.plugin_arg,
        )
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
        )
        results = bench(setup, runs, opts.rounds, not opts.no_warmup, opts.latency)
    table, ok = summarize(results, problems, full, opts.latency, opts.concurrency)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
