"""Traffic classes: a name per request, so that SLOs can make different promises to different
traffic (short interactive chats, long documents, streaming decodes).

A request's class comes from the native format's ``class`` field, or from prompt-length bands
(```classes` interactive=..1024,longdoc=8192..``: prompt tokens, both ends inclusive), which
override the file's classes. A request in no band has no class; class-less SLOs judge every
request, an SLO naming a class only that class's requests (docs/metrics.md).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.slo import CLASS_NAME_RULE, is_class_name
from prefill_tuner.trace.model import Adjustment, Trace

_BOUND = re.compile(r"\d{1,10}")


@dataclass(frozen=True, slots=True)
class ClassBand:
    """Requests whose prompt length lies in [low, high] tokens belong to class ``name``."""

    name: str
    """The class the band assigns."""
    low: int | None
    """Fewest prompt tokens (inclusive); ``None``: no lower end."""
    high: int | None
    """Most prompt tokens (inclusive); ``None``: no upper end."""

    def holds(self, prompt_tokens: int) -> bool:
        """Whether a prompt of this length lies in the band."""
        return (self.low is None or prompt_tokens >= self.low) and (
            self.high is None or prompt_tokens <= self.high
        )

    def __str__(self) -> str:
        low = "" if self.low is None else str(self.low)
        high = "" if self.high is None else str(self.high)
        return f"{self.name}={low}..{high}"


def parse_classes(text: str) -> tuple[ClassBand, ...]:
    """Parse ``interactive=..1024,longdoc=8192..``; every mistake (a bad name, a duplicate,
    a garbage number, LO > HI, overlapping bands) is a one-line :class:`TunerError`."""
    bands: list[ClassBand] = []
    for part in text.split(","):
        item = part.strip()
        name, equals, span = (s.strip() for s in item.partition("="))
        if not equals or ".." not in span:
            raise TunerError(
                f"`classes` {item!r}: expected NAME=LO..HI, NAME=..HI or NAME=LO.. "
                "(prompt tokens), e.g. interactive=..1024,longdoc=8192.."
            )
        if not is_class_name(name):
            raise TunerError(f"`classes` {item!r}: a class name is {CLASS_NAME_RULE}")
        low_text, _, high_text = (s.strip() for s in span.partition(".."))
        low, high = _bound(low_text, item), _bound(high_text, item)
        if low is None and high is None:
            raise TunerError(f"`classes` {item!r}: give at least one end of the band")
        if low is not None and high is not None and low > high:
            raise TunerError(f"`classes` {item!r}: the band's low end {low} is above {high}")
        if any(band.name == name for band in bands):
            raise TunerError(f"`classes`: class {name!r} given more than once")
        band = ClassBand(name, low, high)
        for other in bands:
            if _overlap(band, other):
                raise TunerError(f"`classes`: the bands {other} and {band} overlap")
        bands.append(band)
    return tuple(bands)


def canonical_classes(text: str) -> str:
    """The bands of ``text`` written one way (so equal bands compare equal when stored)."""
    return ",".join(str(band) for band in parse_classes(text))


def _bound(text: str, item: str) -> int | None:
    if text == "":
        return None
    if not _BOUND.fullmatch(text):
        raise TunerError(f"`classes` {item!r}: {text!r} is not a whole number of prompt tokens")
    return int(text)


def _overlap(a: ClassBand, b: ClassBand) -> bool:
    low = max(a.low if a.low is not None else -1, b.low if b.low is not None else -1)
    high = min(a.high if a.high is not None else 10**12, b.high if b.high is not None else 10**12)
    return low <= high


def assign_classes(trace: Trace, bands: tuple[ClassBand, ...]) -> Trace:
    """Every request's class from its prompt length (the first band that holds it; none: no
    class), replacing any class the file gave; the change is counted."""
    requests = tuple(
        replace(
            request,
            traffic_class=next((b.name for b in bands if b.holds(request.prompt_tokens)), None),
        )
        for request in trace.requests
    )
    unclassed = sum(1 for request in requests if request.traffic_class is None)
    bands_text = ",".join(str(band) for band in bands)
    return trace.with_requests(
        requests,
        Adjustment("unclassed", f"prompt length in no band of `classes` {bands_text}", unclassed),
    )


def class_counts(trace: Trace) -> dict[str, int]:
    """Requests per class, in order of the class's first request (class-less ones left out)."""
    counts = Counter(r.traffic_class for r in trace.requests if r.traffic_class is not None)
    return dict(counts)


def check_slo_classes(class_names: set[str] | dict[str, int], wanted: list[str]) -> None:
    """Every class an SLO names must be one the trace's requests carry; a one-line error
    listing the trace's classes otherwise (judging a class without requests would be vacuous)."""
    missing = [name for name in dict.fromkeys(wanted) if name not in class_names]
    if missing:
        have = ", ".join(sorted(class_names)) or "none (give `classes`, or a 'class' field)"
        raise TunerError(
            f"`slos`: no request of the trace is of class {', '.join(map(repr, missing))}; "
            f"the trace's classes: {have}"
        )
