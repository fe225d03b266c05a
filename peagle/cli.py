"""`peagle demo | bench | train | export`: each subcommand lives in its own module.

``peagle --version`` prints the version; ``python -m peagle`` is the same command line.

A subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``. A ValueError from
a subcommand is a bad argument: it is printed as a usage error (exit status 2), without the
traceback unless PEAGLE_TRACEBACK=1.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = {
    "demo": ("peagle.demo", "side-by-side demo on the embedded SmolLM2: plain, EAGLE-3, P-EAGLE, n-gram"),
    "bench": ("peagle.bench", "benchmark arms over draft_k, concurrency, datasets; tables, CSV, plots, JSON"),
    "train": ("peagle.train.cli", "regenerate data and train P-EAGLE / EAGLE-3 heads"),
    "export": ("peagle.export", "write a head in the layout serving engines load"),
}


def main(argv: list[str] | None = None) -> int:
    from peagle import __version__

    parser = argparse.ArgumentParser(prog="peagle", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"peagle {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    modules, parsers = {}, {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = parsers[name] = sub.add_parser(name, help=help_text)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.add_arguments(p)
        modules[name] = module
    args = parser.parse_args(argv)
    if args.command not in modules:
        parser.error(f"`peagle {args.command}` is not available in this build")
    try:
        return int(modules[args.command].run(args) or 0)
    except ValueError as exc:
        if os.environ.get("PEAGLE_TRACEBACK"):
            raise
        parsers[args.command].error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
