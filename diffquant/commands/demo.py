"""`diffquant demo`: the main job on the shipped gated pair, in a few minutes on two CPU cores.

The shipped pair is the long xs Transformer/Diff pair of the outlier-regime campaign (experiments/RESULTS.md):
stories260K's shape, trained with identical data order on the teacher corpus at lr 3e-3 for 33.6M tokens, then
cooled for 8.4M more (41.9M), where the Transformer is in the outlier regime and Diff's λ stays in its range.
Its training log (configs, data sha256s, every loss, the outlier log) sits beside each checkpoint. The job itself
(the gate, Table 5, Figure 8 and the same for weights and Linear inputs) is :func:`diffquant.study.demo.run_demo`;
perplexity is measured on the first 32 windows of each text (the campaign's verdicts use 48: ``--ppl-windows 48``
gives theirs to float rounding). Tables go to the terminal; JSON records, Markdown tables and PNG plots go to
``--out``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..study.demo import PPL_TASKS, demo_pair, demo_tasks, run_demo


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job: gate, outlier tables and degradation tables on the shipped pair")
    p.add_argument("--out", default="demo-out", help="folder for records, tables and plots")
    p.add_argument("--pair", nargs="+", default=None, metavar="NAME | TRANSFORMER DIFF",
                   help="a registered pair's name (--list; default: the shipped gated pair, xs) or the two "
                        "checkpoints of a matched pair trained with identical data order")
    p.add_argument("--list", action="store_true", help="list the registered pairs (calib/models/pairs.json) and exit")
    p.add_argument("--no-stories", action="store_true", help="skip the stories260K reference model")
    p.add_argument("--profile-windows", type=int, default=64, help="held-out windows for the outlier tables")
    p.add_argument("--ppl-windows", type=int, default=32,
                   help="perplexity windows per task and sweep cell (the campaign's verdicts use 48)")
    p.add_argument("--tasks", default=",".join(PPL_TASKS),
                   help="sweep tasks, comma separated (perplexity sets; zero-shot tasks take --limit items)")
    p.add_argument("--limit", type=int, default=100, help="items per zero-shot task")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--calib-tokens", type=int, default=8192, help="GPTQ calibration tokens")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list:
        return _list_pairs()
    pair = demo_pair(_pair_paths(args.pair))
    tasks = demo_tasks([t.strip() for t in args.tasks.split(",") if t.strip()], args.ppl_windows, args.limit)
    summary = run_demo(pair, args.out, tasks=tasks, stories=not args.no_stories, profile_windows=args.profile_windows,
                       batch_size=args.batch_size, calib_tokens=args.calib_tokens, show=print)
    print(f"\nDone in {summary['wall_s']:.0f} s; records, tables and plots are in {summary['out']}/")
    return 0


def _list_pairs() -> int:
    from ..pairs import pair_problem, registered_pairs, registry_path

    pairs, default = registered_pairs()
    print(f"pairs registered in {registry_path()} (demo --pair NAME):")
    for name, pair in pairs.items():
        problem = pair_problem(pair)
        print(f"\n{name}{' (default)' if name == default else ''}: {pair.description}")
        for arch, path in pair.paths.items():
            print(f"  {arch:<12} {path}")
        print(f"  {'status':<12} {'ready (sha256 checked)' if problem is None else problem}")
    return 0


def _pair_paths(given: list[str] | None) -> list[str]:
    """The pair's two checkpoints: a registered name (default: the registry's default) or two paths."""
    from ..pairs import resolve_pair

    if given is not None and len(given) == 2:
        for path in given:
            if not Path(path).exists():
                raise UserError(f"model {path} not found (registered pairs: diffquant demo --list)")
        return given
    if given is not None and len(given) != 1:
        raise UserError("--pair takes a registered name or two checkpoints (TRANSFORMER DIFF)")
    pair = resolve_pair(given[0] if given else None)
    return [str(pair.paths["transformer"]), str(pair.paths["diff"])]
