"""``python -m pytest_gsm8k``: the commands that need no pytest run (README's "Recipes").
``compare A.json B.json``: 0 when B is not worse than A at ``--alpha`` (in every config), 1
when it is or undecided, 2 when they cannot be compared. ``merge SHARD.json...``: the exit
code the unsharded run would have had, 2 when the reports are not every shard of one run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_gsm8k.core.compare import CompareError, compare_all, load_report
from pytest_gsm8k.core.dataset import DatasetError
from pytest_gsm8k.core.merge import ShardError, check_shards
from pytest_gsm8k.core.render import compare_markdown, styled_lines
from pytest_gsm8k.core.scrub import Scrubber, clip, md_text, printable

BETTER_OR_SAME, WORSE, REFUSED = 0, 1, 2  # exit codes


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m pytest_gsm8k", description=__doc__)
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmp = commands.add_parser("compare", help="is run B worse than run A? (two reports)")
    cmp.add_argument("a", metavar="A.json", help="the reference run (the older release)")
    cmp.add_argument("b", metavar="B.json", help="the run under test (the candidate)")
    cmp.add_argument("--alpha", type=float, default=0.05, help="the McNemar test's level (0.05)")
    mrg = commands.add_parser("merge", help="the verdict of a run's --gsm8k-shard reports")
    mrg.add_argument("shards", nargs="+", metavar="SHARD.json", help="every shard's report")
    for flag in ("--report", "--html", "--markdown", "--junitxml"):
        mrg.add_argument(flag, metavar="PATH", help="write the run's output of that name here")
    return main


def _read(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise CompareError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return load_report(text, path)


def _questions(report: Mapping[str, Any]) -> dict[str, str]:
    """The questions of the report's split if it is the embedded copy: the flips' text."""
    from pytest_gsm8k.runtime.data import EMBEDDED, EMBEDDED_NAME, load_split

    dataset = report["dataset"]
    key = (dataset.get("config"), dataset.get("split"))  # strings, or missing (load_report)
    if dataset.get("name") != EMBEDDED_NAME or key not in EMBEDDED:
        return {}
    try:
        split = load_split(None, split=key[1], config=key[0])
    except (DatasetError, OSError):
        return {}
    same = split.fingerprint == dataset.get("fingerprint")
    return {p.id: p.question for p in split.problems} if same else {}


def _say(text: str) -> None:
    print(f"gsm8k: {clip(printable(text.removeprefix('gsm8k: ')), 500)}", file=sys.stderr)


def run_compare(a_path: str, b_path: str, alpha: float) -> int:
    """Print the Markdown; the exit code is the worst of the comparisons' (one per config)."""
    a, b = _read(a_path), _read(b_path)
    results = compare_all(a, b, alpha=alpha, where=(a_path, b_path))
    code, plain = BETTER_OR_SAME, _questions(a)
    for result in results:
        if isinstance(result, CompareError):
            _say(str(result))
            sys.stdout.write(f"### gsm8k compare: {md_text(clip(str(result), 500))}\n\n")
            code = REFUSED
            continue
        flips = (*result.block["newly_failing"], *result.block["newly_passing"])
        # a config's ids carry its name (alpha:test-0042), the split's do not
        texts = {pid: plain.get(pid.rpartition(":")[2], "") for pid in flips}
        sys.stdout.write(compare_markdown(result, texts))
        if result.undecided:
            name = f"config {clip(result.config)}: " if result.config else ""
            _say(f"{name}compare undecided: {result.undecided}")
        if not result.verdict.passed:
            code = max(code, WORSE)
    sys.stdout.flush()
    return code


def run_merge(args: argparse.Namespace) -> int:
    """The shards checked to be one run, then its verdict by the steps that end a run
    (core/tally.py, runtime/finish.py); the exit code that run would have had."""
    from pytest_gsm8k.core.tally import Tally
    from pytest_gsm8k.runtime.finish import page_path, settle, write_outputs
    from pytest_gsm8k.runtime.planning import replan

    outputs = {"report": args.report, "html": args.html, "markdown": args.markdown}
    reports = [_read(path) for path in args.shards]
    merged = check_shards(list(zip(args.shards, reports, strict=True)))
    model = reports[0].get("model")
    plan = replan(merged.plan, Path.cwd(), model if isinstance(model, str) else None, outputs)
    run = Tally()
    run.collect([p for p in plan.problems if p.id not in merged.deselected])
    for record in merged.records:
        run.add_record(record)  # type: ignore[arg-type]  # checked by check_shards
    run.clashes.update(merged.clashes)
    if merged.interrupted:
        run.interrupt()
    first = reports[0]  # the servers the shards ran on: the first shard's, for the report
    servers = {str(c["config"]["name"]): c.get("served") or None for c in first.get("configs", [])}
    servers[""] = first.get("served") or first.get("local_server")
    inputs, top = run.gather(
        plan,
        late={},
        servers=servers,
        scrub=Scrubber(None, None, ()),
        deselected_by=merged.deselected_by,
    )
    verdict = settle(inputs, top, _times(reports))
    for line, _ in styled_lines(verdict):
        print(line)
    page = page_path(args.html, Path.cwd(), Path.cwd(), False)
    errors = write_outputs(plan, verdict, page, junitxml=args.junitxml)
    for line in errors.values():
        _say(line)
    if merged.interrupted:
        return 2  # as the run would: pytest's exit code for an interrupted session
    failed = any(r["outcome"] == "error" for r in merged.records) or errors or verdict.failed
    return WORSE if failed else BETTER_OR_SAME


def _times(reports: Sequence[Mapping[str, Any]]) -> tuple[str, str, float]:
    """The run's start (the first shard's), end (the last one's) and its wall time."""
    started = min(str(r.get("started_at", "")) for r in reports)
    finished = max(str(r.get("finished_at", "")) for r in reports)
    try:
        span = datetime.fromisoformat(finished) - datetime.fromisoformat(started)
    except ValueError:
        return ("", "", 0.0)
    return started, finished, round(span.total_seconds(), 3)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "compare" and not 0.0 < args.alpha < 1.0:  # nor nan
        parser().error(f"--alpha: must be > 0 and < 1, got {args.alpha}")
    try:
        if args.command == "merge":
            return run_merge(args)
        return run_compare(args.a, args.b, args.alpha)
    except (CompareError, ShardError, DatasetError) as exc:  # inputs refused: one line, exit 2
        _say(str(exc))
        return REFUSED


if __name__ == "__main__":
    sys.exit(main())
