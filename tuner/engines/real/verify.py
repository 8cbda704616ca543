"""``tune verify``: chunked prefill must change no output.

A configuration is promoted only if, on the real engine, every prompt token's log-probability
(vLLM's ``prompt_logprobs``) and the greedy output tokens agree with a no-chunking reference
(each prompt prefilled whole, in one step): with the configuration's own budget and threshold,
and with a deliberately small, odd budget and threshold under which concurrent prompts are
cut into irregular chunks (13 tokens a step shared by four prompts, at most 5 each: chunks of
5, 5, 3, ...). A position, mask or KV-offset bug in the chunked path shows as a divergence at
the first position it touches; the report names it per prompt.

Tolerance (:data:`TOLERANCE`): chunking changes only the order in which attention sums over
keys (the softmax's running maximum and sum are merged across chunks), so the two runs differ
by floating-point rounding: about 1e-7 relative per operation in float32, which over a model's
layers stays well under 1e-4 in a log-probability, so 1e-3 leaves a tenfold margin; bfloat16
keeps 8 bits of mantissa (about 4e-3 relative per operation) and float16 11 bits, so their
bounds are 0.1 and 0.05. A real bug moves log-probabilities by tenths to tens: far outside
every bound. Greedy output tokens must be identical.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prefill_tuner.engines.real.engine import ITERATION_FLAG, VllmEngine
from prefill_tuner.engines.real.launcher import VllmServer
from prefill_tuner.engines.real.signals import parse_iteration_log
from prefill_tuner.errors import TunerError
from prefill_tuner.files import read_input, why_unreadable

TOLERANCE = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.1}
"""Largest |Δ log-probability| allowed per prompt token, by the model's dtype (module docs)."""
PROMPT_LENGTHS = (37, 101, 263, 511, 1013)
"""Irregular prompt lengths (none a multiple of a power of two, so chunks end unevenly)."""
OUTPUT_TOKENS = 8
"""Greedy tokens generated per prompt (their sequence must match exactly)."""
IRREGULAR = {
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": 13,
    "max_num_seqs": 4,
    "long_prefill_token_threshold": 5,
}
"""The deliberately irregular chunking: a 13-token step budget shared by up to four prompts,
each capped at 5 tokens a step."""


@dataclass(frozen=True)
class PromptOutput:
    """What one prompt gave under one configuration."""

    logprobs: list[float | None]
    """Log-probability of each prompt token given the ones before it (the first has none)."""
    tokens: list[int]
    """Greedy output tokens."""


@dataclass(frozen=True)
class Divergence:
    """How one prompt's outputs compare with the reference's."""

    prompt: int
    length: int
    max_delta: float
    """Largest |Δ log-probability| over its tokens."""
    first_position: int | None
    """The first prompt position beyond the tolerance (``None``: none)."""
    first_token: int | None
    """The first output token that differs (``None``: all equal)."""


@dataclass(frozen=True)
class Comparison:
    """One configuration against the no-chunking reference."""

    name: str
    settings: dict[str, Any]
    tolerance: float
    prompts: list[Divergence]
    prefill_steps: list[int] = field(default_factory=list)
    """Prefill tokens of each step that prefilled, as the server logged them."""

    @property
    def passed(self) -> bool:
        return all(p.first_position is None and p.first_token is None for p in self.prompts)

    def line(self) -> str:
        worst = max((p.max_delta for p in self.prompts), default=0.0)
        chunked = ""
        if self.prefill_steps:
            sizes = sorted(set(self.prefill_steps))
            shown = ", ".join(map(str, sizes[:8])) + (", …" if len(sizes) > 8 else "")
            chunked = f" over {len(self.prefill_steps)} prefill steps of {shown} tokens"
        if self.passed:
            return (
                f"{self.name}: agrees with the reference on {len(self.prompts)} prompts"
                f"{chunked} (largest |Δ log-prob| {worst:.2e} ≤ {self.tolerance:g}; greedy "
                "tokens equal)"
            )
        first = next(p for p in self.prompts if p.first_position is not None or p.first_token)
        where = (
            f"prompt {first.prompt} ({first.length} tokens) diverges at position "
            f"{first.first_position}"
            if first.first_position is not None
            else f"prompt {first.prompt}'s output token {first.first_token} differs"
        )
        return (
            f"{self.name}: DIFFERS from the reference: {where} (largest |Δ log-prob| "
            f"{worst:.3g} > {self.tolerance:g})"
        )


@dataclass
class VerifyResult:
    dtype: str
    reference: dict[str, Any]
    comparisons: list[Comparison] = field(default_factory=list)
    outputs: dict[str, list[PromptOutput]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def as_record(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "dtype": self.dtype,
            "reference": self.reference,
            "comparisons": [
                {**asdict(c), "passed": c.passed, "line": c.line()} for c in self.comparisons
            ],
            "outputs": {k: [asdict(o) for o in v] for k, v in self.outputs.items()},
        }


def prompts_for(max_model_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of :data:`PROMPT_LENGTHS` (those that fit with the output tokens)."""
    rng = random.Random(seed)
    low = min(1000, max(vocab // 10, 1))
    lengths = [n for n in PROMPT_LENGTHS if n + OUTPUT_TOKENS < max_model_len]
    if not lengths:
        raise TunerError(f"max_model_len {max_model_len}: too short for any verification prompt")
    return [[rng.randrange(low, vocab) for _ in range(n)] for n in lengths]


MAX_REFERENCE_BYTES = 64 * 2**20
"""A reference holds a few prompts' log-probs and tokens (tens of kB): a larger file is no
reference, and is refused by its size rather than read."""


def load_reference(path: Path) -> list[PromptOutput]:
    """The reference outputs a ``tune verify -o FILE`` wrote; a one-line error otherwise."""
    try:
        data = read_input(path, MAX_REFERENCE_BYTES)
    except OSError as exc:
        raise TunerError(f"{path}: cannot read the reference: {why_unreadable(exc)}") from None
    try:
        record = json.loads(data.decode("utf-8"))
        return [PromptOutput(**o) for o in record["outputs"]["reference"]]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise TunerError(
            f"{path}: not the output of tune verify -o FILE ({type(exc).__name__}: {exc})"
        ) from None


def reference_settings(max_model_len: int) -> dict[str, Any]:
    """No chunking: every prompt prefilled whole, in one step."""
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max_model_len,
        "long_prefill_token_threshold": 0,
    }


def compare(
    reference: Sequence[PromptOutput], candidate: Sequence[PromptOutput], tolerance: float
) -> list[Divergence]:
    """Each prompt's divergence from the reference (see :class:`Divergence`)."""
    result = []
    for number, (ref, got) in enumerate(zip(reference, candidate, strict=True)):
        deltas = [
            abs(a - b) if a is not None and b is not None else (0.0 if a == b else math.inf)
            for a, b in zip(ref.logprobs, got.logprobs, strict=True)
        ]
        beyond = next((i for i, d in enumerate(deltas) if d > tolerance), None)
        differs = next(
            (i for i, (a, b) in enumerate(zip(ref.tokens, got.tokens, strict=False)) if a != b),
            None if len(ref.tokens) == len(got.tokens) else min(len(ref.tokens), len(got.tokens)),
        )
        result.append(
            Divergence(
                prompt=number,
                length=len(ref.logprobs),
                max_delta=max(deltas, default=0.0),
                first_position=beyond,
                first_token=differs,
            )
        )
    return result


async def _collect(
    base_url: str, model: str, prompts: list[list[int]], api_key: str | None
) -> list[PromptOutput]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers) as client:

        async def one(prompt: list[int]) -> PromptOutput:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": OUTPUT_TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
                "prompt_logprobs": 0,
                "return_token_ids": True,
            }
            response = await client.post("/v1/completions", json=body)
            if response.status_code != 200:
                raise TunerError(
                    f"the server refused a verification request: HTTP {response.status_code} "
                    f"{response.text[:200]}"
                )
            choice = response.json()["choices"][0]
            logprobs: list[float | None] = []
            for position, entry in enumerate(choice.get("prompt_logprobs") or []):
                if not entry:
                    logprobs.append(None)
                    continue
                token = entry.get(str(prompt[position])) or next(iter(entry.values()))
                logprobs.append(float(token["logprob"]))
            return PromptOutput(logprobs=logprobs, tokens=list(choice.get("token_ids") or []))

        # All at once: under a small budget they share steps, so chunks come out irregular.
        return list(await asyncio.gather(*(one(p) for p in prompts)))


def run_config(
    engine: VllmEngine, settings: dict[str, Any], label: str, prompts: list[list[int]]
) -> tuple[list[PromptOutput], list[int]]:
    """Start the engine's server with ``settings``, run the prompts, stop it. Also returns
    the prefill tokens of each step that prefilled (from the server's step log, where its
    version writes one): the chunking that actually ran."""
    args = engine.settings_args(settings)
    if ITERATION_FLAG in (engine.capabilities.accepted_flags or ()):
        args.append(ITERATION_FLAG)
    spec = engine.server_spec(args, label)
    with VllmServer(spec) as server:
        outputs = asyncio.run(_collect(server.base_url, engine.model, prompts, engine.api_key))
    steps = parse_iteration_log(spec.log_path)
    return outputs, [s["prefill_tokens"] for s in steps if s["prefill_tokens"]]


def model_dtype(engine: VllmEngine) -> str:
    """The dtype the server computes in, as vLLM resolved it."""
    dtype = str(((engine.defaults or {}).get("model_config") or {}).get("dtype") or "bfloat16")
    return dtype.removeprefix("torch.")


def verify(
    engine: VllmEngine,
    candidates: dict[str, dict[str, Any]],
    *,
    fixed: dict[str, Any],
    say: Callable[[str], None] = lambda text: None,
    reference_outputs: list[PromptOutput] | None = None,
) -> VerifyResult:
    """Run the reference (unless its outputs are given) and each candidate configuration on
    the same prompts; compare."""
    max_model_len = engine.max_model_len(fixed)
    prompts = prompts_for(max_model_len, engine.token_high)
    dtype = model_dtype(engine)
    tolerance = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
    reference = {**fixed, **reference_settings(max_model_len)}
    result = VerifyResult(dtype=dtype, reference=reference)
    if reference_outputs is None:
        say(
            f"reference (no chunking): {len(prompts)} prompts of {[len(p) for p in prompts]} tokens"
        )
        reference_outputs, _ = run_config(engine, reference, "verify-reference", prompts)
    elif [len(o.logprobs) for o in reference_outputs] != [len(p) for p in prompts]:
        raise TunerError(
            "the reference outputs given are for other prompts (another max_model_len?)"
        )
    result.outputs["reference"] = reference_outputs
    for name, settings in candidates.items():
        merged = {**fixed, **settings}
        say(f"{name}: {', '.join(f'{k}={v}' for k, v in settings.items())}")
        outputs, chunks = run_config(engine, merged, f"verify-{name}", prompts)
        result.outputs[name] = outputs
        divergences = compare(reference_outputs, outputs, tolerance)
        comparison = Comparison(name, merged, tolerance, divergences, chunks)
        result.comparisons.append(comparison)
        say(comparison.line())
    return result


__all__ = [
    "IRREGULAR",
    "TOLERANCE",
    "Comparison",
    "Divergence",
    "PromptOutput",
    "VerifyResult",
    "compare",
    "load_reference",
    "prompts_for",
    "reference_settings",
    "run_config",
    "verify",
]
