"""Ask vLLM's own ``vllm serve`` argument parser: which flags it accepts, and what a command
line (or ``--config`` YAML) parses to. Runs inside a Python that has vLLM and imports nothing
from the tuner, so vLLM may live in its own virtual environment::

    VLLM_PYTHON vllm_args.py flags
    VLLM_PYTHON vllm_args.py parse [serve arguments ...]

Both print JSON. Import paths differ between vLLM versions; they are probed in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def serve_parser() -> argparse.ArgumentParser:
    """The parser ``vllm serve`` uses, built the way vLLM's CLI builds it."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM ≥ 0.2x: the serve subcommand builds its own parser
        from vllm.entrypoints.cli.serve import ServeSubcommand

        root = FlexibleArgumentParser(prog="vllm")
        subcommand = ServeSubcommand()
        subcommand.subparser_init(root.add_subparsers(dest="subcommand"))
        return root
    except ImportError:
        pass
    for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            make_arg_parser = __import__(module, fromlist=["make_arg_parser"]).make_arg_parser
        except ImportError:
            continue
        root = FlexibleArgumentParser(prog="vllm")
        make_arg_parser(root.add_subparsers(dest="subcommand").add_parser("serve"))
        return root
    raise SystemExit("cannot find vLLM's serve argument parser in this vLLM version")


def _serve_subparser(root: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise SystemExit("vLLM's parser has no serve subcommand")


def main() -> None:
    command, *rest = sys.argv[1:] or ["flags"]
    root = serve_parser()
    if command == "flags":
        serve = _serve_subparser(root)
        flags = sorted({s for a in serve._actions for s in a.option_strings})
        print(json.dumps(flags))
    elif command == "parse":
        args = root.parse_args(["serve", *rest])
        print(json.dumps({k: v for k, v in vars(args).items() if _jsonable(v)}, default=str))
    else:
        raise SystemExit(f"unknown command {command!r}: use flags or parse")


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


if __name__ == "__main__":
    main()
