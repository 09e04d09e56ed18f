"""Array-based left-balanced binary tree math (RFC 9420 §4.2, Appendix C).

Nodes are numbered left to right; leaves sit at even indices (leaf i is node 2i). Trees here
always have a power-of-two number of leaves.
"""

from __future__ import annotations


def log2(x: int) -> int:
    return x.bit_length() - 1 if x else 0


def level(x: int) -> int:
    if x & 1 == 0:
        return 0
    k = 0
    while (x >> k) & 1 == 1:
        k += 1
    return k


def node_width(n_leaves: int) -> int:
    return 0 if n_leaves == 0 else 2 * (n_leaves - 1) + 1


def root(n_leaves: int) -> int:
    return (1 << log2(node_width(n_leaves))) - 1


def left(x: int) -> int:
    k = level(x)
    if k == 0:
        raise ValueError("leaf node has no children")
    return x ^ (0x01 << (k - 1))


def right(x: int) -> int:
    k = level(x)
    if k == 0:
        raise ValueError("leaf node has no children")
    return x ^ (0x03 << (k - 1))


def parent(x: int, n_leaves: int) -> int:
    if x == root(n_leaves):
        raise ValueError("root node has no parent")
    k = level(x)
    b = (x >> (k + 1)) & 0x01
    return (x | (1 << k)) ^ (b << (k + 1))


def sibling(x: int, n_leaves: int) -> int:
    p = parent(x, n_leaves)
    return right(p) if x < p else left(p)


def direct_path(x: int, n_leaves: int) -> list[int]:
    r = root(n_leaves)
    d = []
    while x != r:
        x = parent(x, n_leaves)
        d.append(x)
    return d


def copath(x: int, n_leaves: int) -> list[int]:
    r = root(n_leaves)
    if x == r:
        return []
    d = direct_path(x, n_leaves)
    d.insert(0, x)
    d.pop()
    return [sibling(y, n_leaves) for y in d]


def is_leaf(x: int) -> bool:
    return x & 1 == 0


def leaves_under(x: int) -> range:
    """Leaf indices in the subtree rooted at node x."""
    k = level(x)
    first = (x - ((1 << k) - 1)) // 2
    return range(first, first + (1 << k))


def common_ancestor(x: int, y: int) -> int:
    """Lowest common ancestor of two nodes (Appendix C)."""
    lx, ly = level(x) + 1, level(y) + 1
    if lx <= ly and (x >> ly) == (y >> ly):
        return y
    if ly <= lx and (x >> lx) == (y >> lx):
        return x
    xn, yn, k = x, y, 0
    while xn != yn:
        xn >>= 1
        yn >>= 1
        k += 1
    return (xn << k) + (1 << (k - 1)) - 1
