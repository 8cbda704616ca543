"""Writing the native trace format: Mooncake-style JSONL with our optional fields.

``{"id": "17", "timestamp": 1234.5, "input_length": 900, "output_length": 64,
"hash_ids": [0, 1], "block_size": 512}``: ``timestamp`` in milliseconds from trace start,
rounded to the microsecond. ``hash_ids`` and ``block_size`` only when the request has
prefix blocks; ``block_size`` only when it is not Mooncake's 512. Readers that know only the
Mooncake fields (``vllm bench serve --dataset-name timed_trace``, GuideLLM) ignore the rest.
``class`` (the request's traffic class) only when it has one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from prefill_tuner.files import atomic_text
from prefill_tuner.trace.model import Request
from prefill_tuner.trace.readers import MOONCAKE_BLOCK_SIZE


def native_lines(requests: Iterable[Request]) -> Iterator[str]:
    """One JSON line (with its newline) per request."""
    for request in requests:
        record: dict[str, object] = {
            "id": request.id,
            "timestamp": _milliseconds(request.arrival_s),
            "input_length": request.prompt_tokens,
            "output_length": request.output_tokens,
        }
        if request.prefix_blocks:
            record["hash_ids"] = list(request.prefix_blocks)
            if request.prefix_block_size not in (None, MOONCAKE_BLOCK_SIZE):
                record["block_size"] = request.prefix_block_size
        if request.traffic_class is not None:
            record["class"] = request.traffic_class
        yield json.dumps(record, separators=(", ", ": ")) + "\n"


def _milliseconds(seconds: float) -> int | float:
    """Milliseconds rounded to the microsecond; whole numbers written as integers."""
    value = round(seconds * 1000.0, 3)
    return int(value) if value.is_integer() else value


def write_native(
    requests: Iterable[Request], path: str | Path, inputs: Sequence[str | Path] = ()
) -> None:
    """Write requests as native JSONL, atomically: the file appears whole or not at all, and
    never over one of ``inputs`` (:func:`~prefill_tuner.files.atomic_text`).

    ``-`` writes to standard output.
    """
    if str(path) == "-":
        sys.stdout.writelines(native_lines(requests))
        return
    atomic_write_lines(path, native_lines(requests), inputs)


def atomic_write_lines(
    path: str | Path, lines: Iterable[str], inputs: Sequence[str | Path] = ()
) -> None:
    """Write the lines to ``path`` atomically."""
    with atomic_text(path, inputs) as stream:
        stream.writelines(lines)
