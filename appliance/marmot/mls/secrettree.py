"""The secret tree and its per-sender hash ratchets (RFC 9420 §9).

Secrets are derived lazily and deleted once used (§9.2): a node's secret is dropped when its
children are derived, a ratchet keeps only its next secret, and keys skipped by out-of-order
messages are kept up to `MAX_SKIPPED` per ratchet for at most `MAX_FORWARD` generations ahead.
"""

from __future__ import annotations

from . import crypto
from .errors import DecryptError
from .treemath import left, right, root

HANDSHAKE = 0
APPLICATION = 1
MAX_FORWARD = 1000  # a sender may be this many generations ahead of the last key we used
MAX_SKIPPED = 64  # out-of-order keys kept per ratchet


class SecretTree:
    __slots__ = ("n_leaves", "nodes", "ratchets", "skipped")

    def __init__(self, encryption_secret: bytes | None, n_leaves: int):
        self.n_leaves = n_leaves
        self.nodes: dict[int, bytes] = {} if encryption_secret is None else {root(n_leaves): encryption_secret}
        self.ratchets: dict[tuple[int, int], list] = {}  # (leaf, kind) -> [generation, secret]
        self.skipped: dict[tuple[int, int, int], tuple[bytes, bytes]] = {}

    def copy(self) -> "SecretTree":
        t = SecretTree(None, self.n_leaves)
        t.nodes = dict(self.nodes)
        t.ratchets = {k: list(v) for k, v in self.ratchets.items()}
        t.skipped = dict(self.skipped)
        return t

    def to_obj(self) -> list:
        return [self.n_leaves, self.nodes, [[k[0], k[1], v[0], v[1]] for k, v in self.ratchets.items()],
                [[k[0], k[1], k[2], v[0], v[1]] for k, v in self.skipped.items()]]

    @classmethod
    def from_obj(cls, obj) -> "SecretTree":
        t = cls(None, obj[0])
        t.nodes = {int(k): v for k, v in obj[1].items()}
        t.ratchets = {(a, b): [g, s] for a, b, g, s in obj[2]}
        t.skipped = {(a, b, g): (k, n) for a, b, g, k, n in obj[3]}
        return t

    def _leaf_secret(self, leaf: int) -> bytes:
        target = 2 * leaf
        x = root(self.n_leaves)
        while True:
            if x in self.nodes:
                break
            if x == target:
                raise DecryptError(f"no secret left for leaf {leaf}")
            x = left(x) if target < x else right(x)
        # Walk down from the stored node x to the leaf, deriving and deleting as we go.
        while x != target:
            secret = self.nodes.pop(x)
            lx, rx = left(x), right(x)
            self.nodes[lx] = crypto.expand_with_label(secret, b"tree", b"left", crypto.NH)
            self.nodes[rx] = crypto.expand_with_label(secret, b"tree", b"right", crypto.NH)
            x = lx if target < x else rx
        return self.nodes.pop(target)

    def _ratchet(self, leaf: int, kind: int) -> list:
        if not 0 <= leaf < self.n_leaves:
            raise DecryptError(f"leaf {leaf} outside the tree")
        key = (leaf, kind)
        r = self.ratchets.get(key)
        if r is None:
            leaf_secret = self.nodes.get(2 * leaf)
            if leaf_secret is None:
                leaf_secret = self._leaf_secret(leaf)
            other = APPLICATION if kind == HANDSHAKE else HANDSHAKE
            # the leaf secret is kept until both of its ratchets exist, then deleted
            if (leaf, other) in self.ratchets:
                self.nodes.pop(2 * leaf, None)
            else:
                self.nodes[2 * leaf] = leaf_secret
            label = b"handshake" if kind == HANDSHAKE else b"application"
            r = [0, crypto.expand_with_label(leaf_secret, label, b"", crypto.NH)]
            self.ratchets[key] = r
        return r

    @staticmethod
    def _key_nonce(secret: bytes, generation: int) -> tuple[bytes, bytes]:
        return (crypto.derive_tree_secret(secret, b"key", generation, crypto.NK),
                crypto.derive_tree_secret(secret, b"nonce", generation, crypto.NN))

    def next_key(self, leaf: int, kind: int) -> tuple[int, bytes, bytes]:
        """For sending: the current generation's key and nonce; the ratchet moves on."""
        r = self._ratchet(leaf, kind)
        generation, secret = r
        key, nonce = self._key_nonce(secret, generation)
        r[0], r[1] = generation + 1, crypto.derive_tree_secret(secret, b"secret", generation, crypto.NH)
        return generation, key, nonce

    def key_for(self, leaf: int, kind: int, generation: int) -> tuple[bytes, bytes]:
        """For receiving: the key of `generation` (consumed: asking twice fails)."""
        r = self._ratchet(leaf, kind)
        if generation < r[0]:
            kn = self.skipped.pop((leaf, kind, generation), None)
            if kn is None:
                raise DecryptError(f"key for generation {generation} already used or expired")
            return kn
        if generation - r[0] > MAX_FORWARD:
            raise DecryptError(f"generation {generation} is too far ahead")
        while r[0] < generation:
            g, s = r
            self.skipped[(leaf, kind, g)] = self._key_nonce(s, g)
            r[0], r[1] = g + 1, crypto.derive_tree_secret(s, b"secret", g, crypto.NH)
        mine = sorted(k for k in self.skipped if k[0] == leaf and k[1] == kind)
        for k in mine[:-MAX_SKIPPED] if len(mine) > MAX_SKIPPED else ():
            del self.skipped[k]
        g, s = r
        kn = self._key_nonce(s, g)
        r[0], r[1] = g + 1, crypto.derive_tree_secret(s, b"secret", g, crypto.NH)
        return kn
