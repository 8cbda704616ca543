"""A request's state inside the simulated engine, and its KV blocks' prefix-cache identity."""

from __future__ import annotations

import enum
import weakref
from array import array

from prefill_tuner.trace.model import Request, Trace

_POSITION_BITS = 24
"""Bits for a KV block's index inside a request in a block key (16M blocks: ample)."""


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    REJECTED = 4


class PrefixInterner:
    """Gives every distinct chain of prefix-block ids one small integer.

    vLLM hashes each full KV block together with the hash of the block before it, so a block's
    identity is its whole prefix. Requests whose leading trace prefix blocks are equal get equal
    chain ids for those blocks, and so equal KV block keys: exactly the blocks vLLM would share.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int, int], int] = {}
        self._users: list[int] = []
        """Per chain id: how many chains (requests) contain it."""

    def chain(self, blocks: tuple[int, ...], block_size: int) -> list[int]:
        ids, users = self._ids, self._users
        chain: list[int] = []
        previous = -1
        for block in blocks:
            key = (previous, block, block_size)
            previous = ids.get(key, -2)
            if previous == -2:
                previous = ids[key] = len(ids)
                users.append(0)
            users[previous] += 1  # ids along one chain are distinct: each names its prefix
            chain.append(previous)
        return chain

    def shared_prefix(self, chain: list[int]) -> int:
        """How many leading ids of ``chain`` other chains contain too. Only those can ever be
        looked up by another request (an id is a whole prefix, so the shared ones lead)."""
        users = self._users
        count = 0
        for chain_id in chain:
            if users[chain_id] < 2:
                break
            count += 1
        return count


class RequestTemplate:
    """What the simulator makes of one trace request before any run: the same for every run of
    the trace, so made once per trace (:func:`request_templates`)."""

    __slots__ = (
        "arrival_s",
        "chain",
        "first_position",
        "id",
        "max_tokens",
        "prompt",
        "shareable_tokens",
        "shared_tokens",
        "trace_block_size",
        "traffic_class",
    )

    def __init__(self, request: Request, interner: PrefixInterner) -> None:
        self.id = request.id
        self.arrival_s = request.arrival_s
        self.prompt = request.prompt_tokens
        self.max_tokens = request.output_tokens
        self.traffic_class = request.traffic_class
        self.trace_block_size = request.prefix_block_size or 1
        self.chain = (
            interner.chain(request.prefix_blocks, self.trace_block_size)
            if request.prefix_blocks
            else []
        )
        # Prompt tokens whose content is given by the trace's prefix blocks (the rest, and all
        # output tokens, are unique to this request).
        self.shared_tokens = min(self.prompt, len(self.chain) * self.trace_block_size)
        self.shareable_tokens = self.shared_tokens
        """Leading prompt tokens that other requests' prompts may start with too (narrowed by
        :meth:`narrow_sharing` once every request's chain is known)."""

    def narrow_sharing(self, interner: PrefixInterner) -> None:
        """Keep as shareable only the prefix that some other request's chain also holds."""
        shared_ids = interner.shared_prefix(self.chain)
        self.shareable_tokens = min(self.shared_tokens, shared_ids * self.trace_block_size)


_TEMPLATES: dict[int, tuple[weakref.ref[Trace], list[RequestTemplate]]] = {}
"""id(trace) → the trace (weakly: its entry goes with it) and its requests' templates."""


def request_templates(trace: Trace) -> list[RequestTemplate]:
    """The templates of every request of ``trace``, in order: made (prefixes interned, sharing
    narrowed) on the trace's first run and kept while the trace lives, so a study's trials,
    which all replay one trace object, prepare it once. A trace is frozen, so they stay
    right; runs only read them."""
    key = id(trace)
    kept = _TEMPLATES.get(key)
    if kept is not None and kept[0]() is trace:
        return kept[1]
    interner = PrefixInterner()
    templates = [RequestTemplate(request, interner) for request in trace.requests]
    for template in templates:
        template.narrow_sharing(interner)

    def forget(_: weakref.ref[Trace]) -> None:
        _TEMPLATES.pop(key, None)

    _TEMPLATES[key] = (weakref.ref(trace, forget), templates)
    return templates


class SimRequest:
    """Mutable per-request state, mirroring the fields of vLLM's ``Request`` that scheduling
    reads. Slotted: the simulator touches these millions of times."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "chain",
        "first_position",
        "id",
        "in_flight",
        "index",
        "is_prefill_chunk",
        "keys",
        "last_position",
        "max_tokens",
        "num_cached_blocks",
        "num_computed",
        "num_output",
        "num_tokens",
        "placeholders",
        "preemptions",
        "prompt",
        "registered_blocks",
        "seen_s",
        "sent_s",
        "shareable_tokens",
        "shared_tokens",
        "stale",
        "status",
        "token_times",
        "trace_block_size",
        "traffic_class",
    )

    def __init__(self, index: int, template: RequestTemplate) -> None:
        self.index = index
        self.id = template.id
        self.arrival_s = template.arrival_s
        self.sent_s = template.arrival_s
        """When the client sent it: its arrival, or later when a client limit held it back
        (``max_concurrency``: it waited for a request in flight to finish)."""
        self.seen_s: float | None = None
        """When the scheduler first had it (past the server's front end); ``None``: never
        (rejected, or the run stalled before it got there)."""
        self.prompt = template.prompt
        self.max_tokens = template.max_tokens
        self.traffic_class = template.traffic_class
        """The trace's class of the request, passed on to its record (never scheduled on)."""
        self.num_computed = 0
        self.num_output = 0
        self.num_tokens = self.prompt
        """Prompt plus the output tokens generated so far (vLLM's ``num_tokens``)."""
        self.placeholders = 0
        """Tokens steps in flight will sample (vLLM's ``num_output_placeholders``; async
        scheduling only)."""
        self.is_prefill_chunk = False
        """Its last scheduled step did not complete what it knows (vLLM 0.33's flag, set after
        each step that schedules it; read, and kept, only under a prefill cadence)."""
        self.in_flight = 0
        """Tokens scheduled in steps whose output is not yet applied (async only)."""
        self.stale = 0
        """Of those, tokens scheduled before a preemption: their output still arrives (and is
        delivered) but must not move the request's counters (vLLM's
        ``num_stale_output_tokens``); the request is not resumed until it drains."""
        self.status = Status.WAITING
        self.blocks: list[int] = []
        self.num_cached_blocks = 0
        """Leading blocks that are full and cached (hit, or registered when scheduled)."""
        self.registered_blocks = 0
        """Of those, how many lead with their key in the prefix cache's map (see
        ``KVCache``: a block no other request can look up is registered only if this request
        is preempted and may look it up itself)."""
        self.preemptions = 0
        self.token_times = array("d")
        """When each output token was sampled: the end of its step (8 bytes a token: a long
        trace has millions). Its client reads it later (:mod:`.request_path`)."""
        self.first_position = 0
        """Of the outputs of the step that sampled its first token, how many came before its
        own (the API server handles them in order)."""
        self.last_position = 0
        """The same for its last token."""
        self.trace_block_size = template.trace_block_size
        self.chain = template.chain
        """The request's prefix chain ids (:class:`PrefixInterner`; shared with its template,
        never changed)."""
        self.shared_tokens = template.shared_tokens
        self.shareable_tokens = template.shareable_tokens
        self.keys: list[int] = []
        """The block keys of the request's leading blocks, as far as the KV cache has asked
        (:meth:`keys_to`): each block's key is computed once however often it is registered,
        freed or evicted."""

    def keys_to(self, end: int, block_size: int) -> list[int]:
        """:attr:`keys`, made to cover at least blocks ``0`` to ``end - 1`` (a block's key
        depends on its index alone: :meth:`block_keys`)."""
        keys = self.keys
        if len(keys) < end:
            keys += self.block_keys(len(keys), end, block_size)
        return keys

    def block_keys(self, start: int, end: int, block_size: int) -> list[int]:
        """Prefix-cache identities of the request's KV blocks ``start`` to ``end - 1``.

        A block made only of trace-described prompt tokens is keyed by the chain id of the
        trace block holding its last token (which fixes every token before it) and its
        position; any other block is private to this request (negative keys never meet a
        shared one).
        """
        shared_end = min(end, self.shared_tokens // block_size)
        keys: list[int] = []
        chain, size = self.chain, self.trace_block_size
        position = start
        while position < shared_end:  # one range of consecutive keys per trace block
            trace_block = ((position + 1) * block_size - 1) // size
            stop = min(shared_end, (trace_block + 1) * size // block_size)
            base = chain[trace_block] << _POSITION_BITS
            keys.extend(range(base + position, base + stop))
            position = stop
        private = -((self.index + 1) << _POSITION_BITS)
        keys.extend(range(private - max(start, shared_end), private - end, -1))
        return keys
