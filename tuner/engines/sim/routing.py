"""Routers in front of several replicas of one engine: which replica gets each request.

A router decides when a request arrives, from what a real router can know then: how many
requests each replica has in flight (sent, last token not yet returned) and which prompts it
sent where. The policies are the ones production routers ship (``docs/replicas.md``):

- ``round-robin``: replica 0, 1, …, N−1, 0, … (vLLM production-stack's ``roundrobin``).
- ``least-outstanding``: the replica with the fewest requests in flight (Envoy's and llm-d's
  queue-depth choice); ties go round the replicas, starting after the last one chosen (a
  fixed tie-break would pile a light load onto replica 0).
- ``prefix-aware``: SGLang's router's cache-aware policy with its defaults. When the load is
  imbalanced (the most loaded replica has more than :data:`BALANCE_ABS` requests more than the
  least loaded, and more than :data:`BALANCE_REL` times as many) the least loaded; otherwise
  the replica whose earlier prompts share the longest prefix with this one, when that prefix
  is more than :data:`CACHE_THRESHOLD` of the prompt; otherwise the least loaded. The router
  keeps its own record of the prefixes it sent where (as SGLang's radix tree does), not the
  replicas' caches: it never sees an eviction.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

from prefill_tuner.engines.sim.request import SimRequest

RouterName = Literal["round-robin", "least-outstanding", "prefix-aware"]
"""The routers :func:`make_router` makes."""
ROUTERS: tuple[str, ...] = get_args(RouterName)

BALANCE_ABS = 32
"""SGLang router's ``balance_abs_threshold`` default."""
BALANCE_REL = 1.0001
"""SGLang router's ``balance_rel_threshold`` default."""
CACHE_THRESHOLD = 0.5
"""SGLang router's ``cache_threshold`` default: the share of the prompt that must match."""


class Router(Protocol):
    """Picks a replica for each request, in arrival order."""

    def choose(self, request: SimRequest, outstanding: list[int]) -> int:
        """The replica for ``request``; ``outstanding[i]``: requests in flight on replica i."""
        ...


class RoundRobin:
    def __init__(self, replicas: int) -> None:
        self._replicas = replicas
        self._next = 0

    def choose(self, request: SimRequest, outstanding: list[int]) -> int:
        choice = self._next
        self._next = (choice + 1) % self._replicas
        return choice


class LeastOutstanding:
    def __init__(self) -> None:
        self._last = -1

    def choose(self, request: SimRequest, outstanding: list[int]) -> int:
        self._last = _least(outstanding, self._last)
        return self._last


def _least(outstanding: list[int], last: int) -> int:
    """The replica with the fewest requests in flight, ties going to the first after
    ``last`` (round the replicas)."""
    count = len(outstanding)
    fewest = min(outstanding)
    for step in range(1, count + 1):
        index = (last + step) % count
        if outstanding[index] == fewest:
            return index
    raise AssertionError("unreachable")


class PrefixAware:
    def __init__(self, replicas: int) -> None:
        self._sent: list[set[int]] = [set() for _ in range(replicas)]
        """Per replica: the prefix ids (whole prefixes, see ``PrefixInterner``) sent to it."""
        self._last = -1

    def choose(self, request: SimRequest, outstanding: list[int]) -> int:
        least = _least(outstanding, self._last)
        chain = request.chain
        if not chain:
            self._last = least
            return least
        lightest, heaviest = outstanding[least], max(outstanding)
        if heaviest - lightest > BALANCE_ABS and heaviest > lightest * BALANCE_REL:
            choice = least
        else:
            matches = [_leading(chain, sent) for sent in self._sent]
            best = max(matches)
            matched_tokens = min(best * request.trace_block_size, request.prompt)
            if matched_tokens <= CACHE_THRESHOLD * request.prompt:
                choice = least
            else:  # the longest match; among equal ones, the least loaded
                candidates = [i for i, m in enumerate(matches) if m == best]
                choice = min(candidates, key=lambda i: (outstanding[i], i))
        self._sent[choice].update(chain)
        self._last = choice
        return choice


def _leading(chain: list[int], sent: set[int]) -> int:
    """How many leading ids of ``chain`` are in ``sent``."""
    count = 0
    for chain_id in chain:
        if chain_id not in sent:
            break
        count += 1
    return count


def make_router(name: str, replicas: int) -> Router:
    """The router called ``name`` (one of :data:`ROUTERS`) for ``replicas`` replicas."""
    if name == "round-robin":
        return RoundRobin(replicas)
    if name == "least-outstanding":
        return LeastOutstanding()
    if name == "prefix-aware":
        return PrefixAware(replicas)
    raise ValueError(f"unknown router {name!r}; routers: {', '.join(ROUTERS)}")
