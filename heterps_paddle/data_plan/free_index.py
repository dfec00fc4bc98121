"""Which of a pass's names have a free copy, by the order they were first offered: set, clear and the first one
from a place, each in O(log n) (a tree of counts over the names' indices, grown by doubling).

A heap with lazy deletion could not serve this: a name taken off its trainer's own heap would stay on a heap of
every trainer's names until some take popped it, and the take that first reached there paid for all of them.
"""

from __future__ import annotations


class FreeIndex:
    """A set of small integers (the names' indices) with ``first_from``: the smallest member at or after a place."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = max(1, capacity)
        self.tree = [0] * (2 * self.capacity)  # tree[capacity + i]: 1 when i is a member; above: sums

    def __contains__(self, index: int) -> bool:
        return index < self.capacity and self.tree[self.capacity + index] > 0

    def __len__(self) -> int:
        return self.tree[1]

    def set(self, index: int, member: bool) -> None:
        if index >= self.capacity:
            if not member:
                return
            self._grow(index + 1)
        node = self.capacity + index
        value = 1 if member else 0
        if self.tree[node] == value:
            return
        delta = value - self.tree[node]
        while node:
            self.tree[node] += delta
            node >>= 1

    def first_from(self, index: int) -> int | None:
        """The smallest member at or after ``index``, or None."""
        if index >= self.capacity:
            return None
        tree, node = self.tree, self.capacity + max(0, index)
        if tree[node]:
            return node - self.capacity
        # up while nothing at or after ``index`` is under the node's right sibling ...
        while node > 1:
            if not node & 1 and tree[node + 1]:
                node += 1
                break
            node >>= 1
        else:
            return None
        # ... then down to that subtree's first member
        while node < self.capacity:
            node <<= 1
            if not tree[node]:
                node += 1
        return node - self.capacity

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        leaves = self.tree[self.capacity :] + [0] * (capacity - self.capacity)
        self.capacity = capacity
        self.tree = [0] * capacity + leaves
        for node in range(capacity - 1, 0, -1):
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]
