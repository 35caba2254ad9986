"""Intersection and complement of pattern languages, through automata over code point ranges.

JSON Schema combines string languages in ways a regex cannot write directly: two `pattern`s on
one string (`allOf`, `if`/`then`), a `pattern` that must fail (`not`, a failing `if`), a key
matching one `patternProperties` pattern but not another. Each pattern tree (`pattern_tree`) is
turned into a DFA whose alphabet is the set of code point intervals the trees distinguish; DFAs
are combined by product (and) or by completing and flipping accepting states (not), minimised,
and written back as a tree by state elimination, which the string branch then emits like any
parsed pattern. The written tree can grow quickly with the number of states, so combinations
beyond `MAX_DFA_STATES` states or `MAX_TREE_NODES` nodes are refused, never built.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from radixgen.constrained.pattern_length import PatternError
from radixgen.constrained.pattern_tree import Anchor, CodePoints, Concat, Ranges, Repeat, Union
from radixgen.constrained.regex_text import MAX_CODE_POINT, normalize_ranges

MAX_NFA_STATES = 20_000
# Edge visits allowed in the subset construction (about a second of Python).
MAX_SUBSET_WORK = 5_000_000
MAX_DFA_STATES = 400
MAX_TREE_NODES = 20_000
# The written tree is emitted and measured recursively: deeper trees are refused.
MAX_TREE_DEPTH = 120


@dataclass(frozen=True)
class Language:
    """A boolean combination of pattern trees: `And`, `Not` or a leaf tree."""


@dataclass(frozen=True)
class Leaf(Language):
    tree: object


@dataclass(frozen=True)
class And(Language):
    parts: tuple


@dataclass(frozen=True)
class Not(Language):
    part: Language


def language_tree(language: Language) -> object | None:
    """A pattern tree for `language` (None: the empty language).

    Raises:
        PatternError: the automaton or the written tree would be too large.
    """
    trees = list(_leaves(language))
    bounds = _interval_starts(trees)
    dfa = _build(language, bounds)
    return _to_tree(_minimise(dfa), bounds)


# ---- alphabet: the code point intervals the trees tell apart ----


def _leaves(language: Language):
    if isinstance(language, Leaf):
        yield language.tree
    elif isinstance(language, And):
        for part in language.parts:
            yield from _leaves(part)
    else:
        yield from _leaves(language.part)


def _interval_starts(trees: list) -> list[int]:
    """Sorted starts of the elementary intervals: every class is a union of them."""
    starts = {0}
    stack = list(trees)
    while stack:
        node = stack.pop()
        if isinstance(node, CodePoints):
            for low, high in node.ranges:
                starts.add(low)
                if high < MAX_CODE_POINT:
                    starts.add(high + 1)
        elif isinstance(node, Concat):
            stack.extend(node.items)
        elif isinstance(node, Union):
            stack.extend(node.options)
        elif isinstance(node, Repeat):
            stack.append(node.item)
    return sorted(starts)


def _symbols(ranges: Ranges, starts: list[int]) -> frozenset[int]:
    """Indices of the elementary intervals inside `ranges`."""
    symbols = set()
    for low, high in ranges:
        first = bisect.bisect_right(starts, low) - 1
        last = bisect.bisect_right(starts, high) - 1
        symbols.update(range(first, last + 1))
    return frozenset(symbols)


# ---- automata ----


@dataclass
class _Dfa:
    """A complete DFA: transitions[state][symbol] -> state; state 0 is the start."""

    transitions: list[list[int]]
    accepting: set[int]


class _Nfa:
    def __init__(self) -> None:
        self.edges: list[list[tuple[frozenset[int], int]]] = []
        self.epsilon: list[list[int]] = []
        # Zero-width moves allowed only before the first character (`^`) or after the last (`$`).
        self.at_start: list[list[int]] = []
        self.at_end: list[list[int]] = []

    def new_state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise PatternError("pattern combination too large to build an automaton for")
        for table in (self.edges, self.epsilon, self.at_start, self.at_end):
            table.append([])
        return len(self.edges) - 1

    def add(self, node: object, start: int, starts: list[int]) -> int:
        """Adds `node` from `start`; returns its end state."""
        if isinstance(node, CodePoints):
            end = self.new_state()
            self.edges[start].append((_symbols(node.ranges, starts), end))
            return end
        if isinstance(node, Concat):
            for item in node.items:
                start = self.add(item, start, starts)
            return start
        if isinstance(node, Anchor):
            end = self.new_state()
            (self.at_start if node.at_start else self.at_end)[start].append(end)
            return end
        if isinstance(node, Union):
            end = self.new_state()
            for option in node.options:
                self.epsilon[self.add(option, start, starts)].append(end)
            return end
        for _ in range(node.min_count):
            start = self.add(node.item, start, starts)
        if node.max_count is None:
            loop = self.new_state()
            self.epsilon[start].append(loop)
            self.epsilon[self.add(node.item, loop, starts)].append(loop)
            return loop
        end = self.new_state()
        self.epsilon[start].append(end)
        for _ in range(node.max_count - node.min_count):
            start = self.add(node.item, start, starts)
            self.epsilon[start].append(end)
        return end

    def closure(self, states, anchors: list[list[int]] | None = None) -> frozenset[int]:
        """States reachable by empty moves (and by the zero-width `anchors` moves, if given)."""
        seen, stack = set(states), list(states)
        while stack:
            state = stack.pop()
            for nxt in self.epsilon[state] + (anchors[state] if anchors else []):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)


def _tree_dfa(tree: object, starts: list[int]) -> _Dfa:
    nfa = _Nfa()
    start = nfa.new_state()
    end = nfa.add(tree, start, starts)
    initial = nfa.closure([start], nfa.at_start)
    index = {initial: 0}
    order = [initial]
    transitions: list[list[int]] = []
    position = 0
    work = 0
    while position < len(order):
        current = order[position]
        position += 1
        row = []
        work += len(starts) * sum(len(nfa.edges[state]) for state in current)
        if work > MAX_SUBSET_WORK:
            raise PatternError("pattern combination too large to build an automaton for")
        for symbol in range(len(starts)):
            targets = [t for s in current for symbols, t in nfa.edges[s] if symbol in symbols]
            target = nfa.closure(targets)
            if target not in index:
                if len(index) >= MAX_DFA_STATES * 4:
                    raise PatternError("pattern combination has too many automaton states")
                index[target] = len(order)
                order.append(target)
            row.append(index[target])
        transitions.append(row)
    accepting = {number for state, number in index.items() if end in nfa.closure(state, nfa.at_end)}
    return _Dfa(transitions, accepting)


def _build(language: Language, starts: list[int]) -> _Dfa:
    if isinstance(language, Leaf):
        return _minimise(_tree_dfa(language.tree, starts))
    if isinstance(language, Not):
        inner = _build(language.part, starts)
        every = set(range(len(inner.transitions)))
        return _Dfa(inner.transitions, every - inner.accepting)
    result = _build(language.parts[0], starts)
    for part in language.parts[1:]:
        result = _minimise(_product(result, _build(part, starts)))
    return result


def _product(left: _Dfa, right: _Dfa) -> _Dfa:
    index = {(0, 0): 0}
    order = [(0, 0)]
    transitions = []
    position = 0
    while position < len(order):
        a, b = order[position]
        position += 1
        row = []
        for symbol in range(len(left.transitions[0])):
            pair = (left.transitions[a][symbol], right.transitions[b][symbol])
            if pair not in index:
                index[pair] = len(order)
                order.append(pair)
            row.append(index[pair])
        transitions.append(row)
    accepting = {n for (a, b), n in index.items() if a in left.accepting and b in right.accepting}
    return _Dfa(transitions, accepting)


def _minimise(dfa: _Dfa) -> _Dfa:
    """Moore's partition refinement, after dropping states that cannot reach acceptance."""
    count = len(dfa.transitions)
    block = [1 if state in dfa.accepting else 0 for state in range(count)]
    while True:
        signatures = {}
        new_block = []
        for state in range(count):
            key = (block[state], *(block[t] for t in dfa.transitions[state]))
            new_block.append(signatures.setdefault(key, len(signatures)))
        if len(signatures) == len(set(block)):
            break
        block = new_block
    # Renumber so that the start block is 0.
    renumber = {block[0]: 0}
    for state in range(count):
        renumber.setdefault(block[state], len(renumber))
    transitions = [None] * len(renumber)
    for state in range(count):
        transitions[renumber[block[state]]] = [renumber[block[t]] for t in dfa.transitions[state]]
    accepting = {renumber[block[state]] for state in dfa.accepting}
    if len(transitions) > MAX_DFA_STATES:
        raise PatternError("pattern combination has too many automaton states")
    return _Dfa(transitions, accepting)


# ---- back to a tree, by state elimination ----


def _to_tree(dfa: _Dfa, starts: list[int]) -> object | None:
    live = _live_states(dfa)
    if 0 not in live:
        return None
    states = sorted(live)
    start, final = -1, -2
    edges: dict[tuple[int, int], object] = {}  # (from, to) -> tree
    for state in states:
        by_target: dict[int, list[int]] = {}
        for symbol, target in enumerate(dfa.transitions[state]):
            if target in live:
                by_target.setdefault(target, []).append(symbol)
        for target, symbols in by_target.items():
            edges[(state, target)] = CodePoints(_ranges(symbols, starts))
        if state in dfa.accepting:
            edges[(state, final)] = Concat(())
    edges[(start, 0)] = Concat(())
    remaining = set(states)
    while remaining:
        # Eliminate the state with the fewest in x out edges first: smaller trees.
        state = min(remaining, key=lambda s: _degree(edges, s))
        remaining.discard(state)
        loop = edges.pop((state, state), None)
        incoming = [(p, tree) for (p, q), tree in edges.items() if q == state]
        outgoing = [(q, tree) for (p, q), tree in edges.items() if p == state]
        for p, _ in incoming:
            del edges[(p, state)]
        for q, _ in outgoing:
            del edges[(state, q)]
        middle = Repeat(loop, 0, None) if loop is not None else None
        for p, into in incoming:
            for q, out_of in outgoing:
                path = _concat(into, middle, out_of)
                edges[(p, q)] = _union(edges.get((p, q)), path)
        if sum(_size(tree) for tree in edges.values()) > MAX_TREE_NODES:
            raise PatternError("pattern combination too large to write as a regex")
    tree = edges.get((start, final))
    if tree is not None and _depth(tree) > MAX_TREE_DEPTH:
        raise PatternError("pattern combination too deeply nested to write as a regex")
    return tree


def _depth(tree: object) -> int:
    """Nesting depth, without recursion (the trees may be deep)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, Concat):
            stack.extend((item, depth + 1) for item in node.items)
        elif isinstance(node, Union):
            stack.extend((option, depth + 1) for option in node.options)
        elif isinstance(node, Repeat):
            stack.append((node.item, depth + 1))
    return deepest


def _live_states(dfa: _Dfa) -> set[int]:
    reverse: dict[int, set[int]] = {}
    for state, row in enumerate(dfa.transitions):
        for target in row:
            reverse.setdefault(target, set()).add(state)
    live, stack = set(dfa.accepting), list(dfa.accepting)
    while stack:
        for previous in reverse.get(stack.pop(), ()):
            if previous not in live:
                live.add(previous)
                stack.append(previous)
    return live


def _ranges(symbols: list[int], starts: list[int]) -> Ranges:
    ranges = []
    for symbol in symbols:
        end = starts[symbol + 1] - 1 if symbol + 1 < len(starts) else MAX_CODE_POINT
        ranges.append((starts[symbol], end))
    return tuple(normalize_ranges(ranges))


def _degree(edges: dict, state: int) -> int:
    into = sum(1 for p, q in edges if q == state and p != state)
    out_of = sum(1 for p, q in edges if p == state and q != state)
    return into * out_of


def _concat(*parts: object | None) -> object:
    items: list = []
    for part in parts:
        if part is None:
            continue
        items.extend(part.items if isinstance(part, Concat) else [part])
    return items[0] if len(items) == 1 else Concat(tuple(items))


def _union(current: object | None, added: object) -> object:
    if current is None:
        return added
    options = list(current.options) if isinstance(current, Union) else [current]
    if added not in options:
        options.append(added)
    return Union(tuple(options))


def _size(tree: object) -> int:
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, Concat):
            stack.extend(node.items)
        elif isinstance(node, Union):
            stack.extend(node.options)
        elif isinstance(node, Repeat):
            stack.append(node.item)
    return count


def dfa_tree(transitions: list[list[int]], accepting: set[int], starts: list[int]) -> object | None:
    """A tree for a complete DFA given as a table over the intervals beginning at `starts`.

    Raises:
        PatternError: the written tree would be too large.
    """
    return _to_tree(_minimise(_Dfa(transitions, accepting)), starts)
