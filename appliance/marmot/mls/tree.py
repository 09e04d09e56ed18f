"""The ratchet tree (RFC 9420 §7): nodes, resolution, tree hashes, parent hashes, TreeKEM.

`RatchetTree` holds a list of nodes (`LeafNode` at even indices, `ParentNode` at odd ones, `None`
for blank) with a power-of-two leaf count. Nodes are immutable; changing one replaces it and
drops the cached subtree hashes above it, so copies (`copy()`) are cheap and independent.
"""

from __future__ import annotations

from . import crypto
from .codec import Reader, decode_exact, optional, u8, u32, vl
from .errors import DecryptError, StateError, TreeError
from .structs import (
    SRC_COMMIT,
    HPKECiphertext,
    LeafNode,
    ParentNode,
    UpdatePathNode,
    encode_ratchet_tree,
    read_ratchet_tree_nodes,
)
from .treemath import direct_path, is_leaf, leaves_under, left, parent, right, root


class RatchetTree:
    __slots__ = ("nodes", "_hashes")

    def __init__(self, nodes: list, _hashes: dict | None = None):
        self.nodes = nodes
        self._hashes = {} if _hashes is None else _hashes

    # -- construction and encoding ------------------------------------------------------------

    @classmethod
    def from_nodes(cls, nodes: list) -> "RatchetTree":
        """Build from a decoded ratchet_tree vector: validates the shape and pads it to full size."""
        if not nodes:
            raise TreeError("empty ratchet tree")
        if nodes[-1] is None:
            raise TreeError("ratchet tree ends with a blank node")
        for i, node in enumerate(nodes):
            if node is None:
                continue
            if is_leaf(i) != isinstance(node, LeafNode):
                raise TreeError(f"node {i} has the wrong type for its position")
        width = 1
        while width < len(nodes):
            width = 2 * width + 1
        nodes = list(nodes) + [None] * (width - len(nodes))
        return cls(nodes)

    @classmethod
    def decode(cls, data: bytes) -> "RatchetTree":
        return cls.from_nodes(decode_exact(data, read_ratchet_tree_nodes))

    @classmethod
    def read(cls, r: Reader) -> "RatchetTree":
        return cls.from_nodes(read_ratchet_tree_nodes(r))

    @classmethod
    def one_member(cls, leaf: LeafNode) -> "RatchetTree":
        return cls([leaf])

    def encode(self) -> bytes:
        return encode_ratchet_tree(self.nodes)

    def copy(self) -> "RatchetTree":
        return RatchetTree(list(self.nodes), dict(self._hashes))

    # -- shape ------------------------------------------------------------------------------

    @property
    def n_leaves(self) -> int:
        return (len(self.nodes) + 1) // 2

    @property
    def root(self) -> int:
        return root(self.n_leaves)

    def leaf(self, leaf_index: int) -> LeafNode | None:
        i = 2 * leaf_index
        return self.nodes[i] if 0 <= i < len(self.nodes) else None

    def leaves(self):
        """(leaf_index, LeafNode) for every non-blank leaf."""
        nodes = self.nodes
        for i in range(0, len(nodes), 2):
            if nodes[i] is not None:
                yield i // 2, nodes[i]

    def set_node(self, i: int, node) -> None:
        self.nodes[i] = node
        hashes = self._hashes
        n = self.n_leaves
        r = root(n)
        hashes.pop(i, None)
        while i != r:
            i = parent(i, n)
            hashes.pop(i, None)

    def direct_path(self, leaf_index: int) -> list[int]:
        return direct_path(2 * leaf_index, self.n_leaves)

    def _extend(self) -> None:
        n = len(self.nodes)
        self.nodes.extend([None] * (n + 1))

    def truncate(self) -> None:
        """Drop right halves that hold no member (RFC 9420 §7.8 Remove)."""
        while self.n_leaves > 1:
            half = len(self.nodes) // 2
            if any(self.nodes[i] is not None for i in range(half + 1, len(self.nodes), 2)):
                return
            del self.nodes[half:]
            for k in [k for k in self._hashes if k >= half]:
                del self._hashes[k]

    # -- membership changes -----------------------------------------------------------------

    def add_leaf(self, leaf: LeafNode) -> int:
        """Insert at the leftmost blank leaf (extending if none); mark it unmerged above. Returns its index."""
        nodes = self.nodes
        for i in range(0, len(nodes), 2):
            if nodes[i] is None:
                break
        else:
            i = len(nodes) + 1
            self._extend()
        leaf_index = i // 2
        for p in self.direct_path(leaf_index):
            node = self.nodes[p]
            if node is not None:
                self.set_node(p, ParentNode(node.encryption_key, node.parent_hash,
                                            node.unmerged_leaves + (leaf_index,)))
        self.set_node(i, leaf)
        return leaf_index

    def blank_path(self, leaf_index: int) -> None:
        for p in self.direct_path(leaf_index):
            if self.nodes[p] is not None:
                self.set_node(p, None)

    def update_leaf(self, leaf_index: int, leaf: LeafNode) -> None:
        self.blank_path(leaf_index)
        self.set_node(2 * leaf_index, leaf)

    def remove_leaf(self, leaf_index: int) -> None:
        self.blank_path(leaf_index)
        self.set_node(2 * leaf_index, None)
        self.truncate()

    # -- resolution and paths -----------------------------------------------------------------

    def resolution(self, x: int, exclude=()) -> list[int]:
        node = self.nodes[x]
        if node is not None:
            if is_leaf(x):
                return [] if x // 2 in exclude else [x]
            return [x] + [2 * u for u in node.unmerged_leaves if u not in exclude]
        if is_leaf(x):
            return []
        return self.resolution(left(x), exclude) + self.resolution(right(x), exclude)

    def filtered_direct_path(self, leaf_index: int) -> list[tuple[int, int]]:
        """(node, copath child) pairs of the filtered direct path (§4.1.2)."""
        n = self.n_leaves
        out = []
        x = 2 * leaf_index
        r = root(n)
        while x != r:
            p = parent(x, n)
            s = right(p) if x < p else left(p)
            if self._has_resolution(s):
                out.append((p, s))
            x = p
        return out

    def _has_resolution(self, x: int) -> bool:
        if self.nodes[x] is not None:
            return True
        if is_leaf(x):
            return False
        return self._has_resolution(left(x)) or self._has_resolution(right(x))

    # -- hashes -----------------------------------------------------------------------------

    def tree_hash(self, x: int | None = None, removed: frozenset = frozenset()) -> bytes:
        """Tree hash of the subtree at x (root by default), optionally with some leaves removed."""
        if x is None:
            x = self.root
        if removed:
            lv = leaves_under(x)
            if any(leaf in lv for leaf in removed):
                return self._hash_removed(x, removed)
        h = self._hashes.get(x)
        if h is None:
            node = self.nodes[x]
            if is_leaf(x):
                h = crypto.hash(u8(1) + u32(x // 2) + optional(node.encode() if node is not None else None))
            else:
                h = crypto.hash(u8(2) + optional(node.encode() if node is not None else None)
                                + vl(self.tree_hash(left(x))) + vl(self.tree_hash(right(x))))
            self._hashes[x] = h
        return h

    def _hash_removed(self, x: int, removed: frozenset) -> bytes:
        node = self.nodes[x]
        if is_leaf(x):
            if x // 2 in removed:
                node = None
            return crypto.hash(u8(1) + u32(x // 2) + optional(node.encode() if node is not None else None))
        if node is not None:
            node = ParentNode(node.encryption_key, node.parent_hash,
                              tuple(u for u in node.unmerged_leaves if u not in removed))
        return crypto.hash(u8(2) + optional(node.encode() if node is not None else None)
                           + vl(self.tree_hash(left(x), removed)) + vl(self.tree_hash(right(x), removed)))

    def parent_hash(self, p: int, sibling: int) -> bytes:
        """The parent hash a child of p stores, given the other child `sibling` (§7.9)."""
        node = self.nodes[p]
        sib = self.tree_hash(sibling, frozenset(node.unmerged_leaves))
        return crypto.hash(vl(node.encryption_key) + vl(node.parent_hash) + vl(sib))

    def _stored_parent_hash(self, x: int) -> bytes | None:
        node = self.nodes[x]
        if isinstance(node, LeafNode):
            return node.parent_hash if node.leaf_node_source == SRC_COMMIT else None
        return node.parent_hash

    def verify_parent_hashes(self) -> None:
        """Every non-blank parent P is parent-hash valid with respect to exactly one descendant D (§7.9.2,
        top down): D is in the resolution of P's child C on its side, D's parent_hash is the parent hash
        of P with copath child S, and P's unmerged leaves under C are exactly the rest of C's resolution."""
        nodes = self.nodes
        for p in range(1, len(nodes), 2):
            node = nodes[p]
            if node is None:
                continue
            found = 0
            for c, s in ((left(p), right(p)), (right(p), left(p))):
                res = self.resolution(c)
                candidates = [d for d in res if self._stored_parent_hash(d) is not None]
                if not candidates:
                    continue
                ph = self.parent_hash(p, s)
                under = leaves_under(c)
                unmerged = {2 * u for u in node.unmerged_leaves if u in under}
                for d in candidates:
                    if self._stored_parent_hash(d) == ph and unmerged == set(res) - {d}:
                        found += 1
            if found != 1:
                raise TreeError(f"parent node {p} is not parent-hash valid")

    def verify_leaves(self, group_id: bytes) -> None:
        """Leaf signatures, unique encryption and signature keys across the tree (§7.3, §7.9), and
        consistent unmerged leaves (§12.4.3.1)."""
        seen_sig, seen_enc = set(), set()
        for i, node in enumerate(self.nodes):
            if node is None:
                continue
            if node.encryption_key in seen_enc:
                raise TreeError(f"node {i}: duplicate encryption key")
            seen_enc.add(node.encryption_key)
            if isinstance(node, LeafNode):
                if node.signature_key in seen_sig:
                    raise TreeError(f"leaf {i // 2}: duplicate signature key")
                seen_sig.add(node.signature_key)
                if not crypto.verify_with_label(node.signature_key, b"LeafNodeTBS", node.tbs(group_id, i // 2),
                                                node.signature):
                    raise TreeError(f"leaf {i // 2}: leaf node signature does not verify")
        for p in range(1, len(self.nodes), 2):
            node = self.nodes[p]
            if node is None:
                continue
            span = leaves_under(p)
            for u in node.unmerged_leaves:
                if u not in span or self.nodes[2 * u] is None:
                    raise TreeError(f"parent node {p}: invalid unmerged leaf {u}")
                # §12.4.3.1: every non-blank node between the leaf and p lists it as unmerged too
                x = 2 * u
                while (x := parent(x, self.n_leaves)) != p:
                    below = self.nodes[x]
                    if below is not None and u not in below.unmerged_leaves:
                        raise TreeError(f"parent node {x}: leaf {u} is unmerged above it but not in it")

    # -- TreeKEM ------------------------------------------------------------------------------

    def set_path(self, leaf_index: int, path: list[tuple[int, bytes]]) -> bytes:
        """Install new keys on the filtered direct path (blanking the rest) with their parent hashes.

        `path` is [(node, encryption_key)] bottom-up. Returns the parent hash the leaf must carry.
        """
        self.blank_path(leaf_index)
        for node_index, key in path:
            self.set_node(node_index, ParentNode(key))
        child_hash = b""
        x = 2 * leaf_index
        # Top-down: each node's parent_hash covers the filtered node above it.
        for k in range(len(path) - 1, -1, -1):
            node_index, key = path[k]
            ph = b""
            if k + 1 < len(path):
                above = path[k + 1][0]
                ph = self.parent_hash(above, self._other_child(above, node_index))
            self.set_node(node_index, ParentNode(key, ph))
        if path:
            child_hash = self.parent_hash(path[0][0], self._other_child(path[0][0], x))
        return child_hash

    def _other_child(self, p: int, descendant: int) -> int:
        return right(p) if descendant < p else left(p)


def derive_path(n_nodes: int, first_secret: bytes) -> tuple[list[bytes], list[tuple[bytes, bytes]], bytes]:
    """path secrets, (priv, pub) per node, and the commit secret, from the first path secret."""
    secrets, keys = [], []
    s = first_secret
    for _ in range(n_nodes):
        secrets.append(s)
        keys.append(crypto.derive_keypair(crypto.derive_secret(s, b"node")))
        s = crypto.derive_secret(s, b"path")
    return secrets, keys, s


def encrypt_path(tree: RatchetTree, fdp: list[tuple[int, int]], path_secrets: list[bytes],
                 pubs: list[bytes], context: bytes, exclude) -> tuple[UpdatePathNode, ...]:
    out = []
    for (node_index, copath_child), secret, pub in zip(fdp, path_secrets, pubs):
        cts = []
        for r in tree.resolution(copath_child, exclude):
            kem_output, ct = crypto.encrypt_with_label(tree.nodes[r].encryption_key, b"UpdatePathNode", context,
                                                       secret)
            cts.append(HPKECiphertext(kem_output, ct))
        out.append(UpdatePathNode(pub, tuple(cts)))
    return tuple(out)


def decrypt_path(tree: RatchetTree, fdp: list[tuple[int, int]], nodes, my_leaf: int, privs: dict,
                 context: bytes, exclude) -> tuple[dict, bytes, bytes]:
    """Find our ciphertext in an UpdatePath, decrypt and derive upward.

    `tree` already carries the new path keys; `privs` maps node index to private key for the
    nodes we hold. Returns ({node: priv} for the path nodes we now hold, commit_secret).
    """
    mine = 2 * my_leaf
    n = tree.n_leaves
    ancestors = {mine}
    for p in direct_path(mine, n):
        ancestors.add(p)
    for k, (node_index, copath_child) in enumerate(fdp):
        lv = leaves_under(copath_child)
        if my_leaf not in lv:
            continue
        res = tree.resolution(copath_child, exclude)
        for pos, r in enumerate(res):
            if r in ancestors and r in privs:
                break
        else:
            raise DecryptError("no private key for any node of the resolution the path was encrypted to")
        cts = nodes[k].encrypted_path_secret
        if len(cts) != len(res):
            raise TreeError("update path node has the wrong number of ciphertexts")
        ct = cts[pos]
        secret = crypto.decrypt_with_label(privs[r], b"UpdatePathNode", context, ct.kem_output, ct.ciphertext)
        secrets, keys, commit_secret = derive_path(len(fdp) - k, secret)
        held = {}
        for j, (priv, pub) in enumerate(keys):
            if pub != nodes[k + j].encryption_key:
                raise TreeError("update path public key does not match the decrypted path secret")
            held[fdp[k + j][0]] = priv
        return held, commit_secret, secret
    raise StateError("not a member below the committer's path")

