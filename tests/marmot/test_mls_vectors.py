"""Every cipher-suite-1 case of the MLS working group's interop vectors (mls-implementations).

Each test is parametrized by case, so the pytest summary gives per-file pass counts.
"""

from __future__ import annotations

import dataclasses

import pytest

from appliance.marmot.mls import crypto
from appliance.marmot.mls import keyschedule as ks
from appliance.marmot.mls import treemath as tm
from appliance.marmot.mls.codec import Reader, decode_exact
from appliance.marmot.mls.errors import DecodeError
from appliance.marmot.mls.framing import (
    check_membership_tag,
    protect_private,
    protect_public,
    sign_content,
    unprotect_private,
    verify_content,
)
from appliance.marmot.mls.group import Group, KeyPackageSecrets, join_from_welcome, verify_key_package
from appliance.marmot.mls.secrettree import APPLICATION, HANDSHAKE, SecretTree
from appliance.marmot.mls.structs import (
    CT_APPLICATION,
    CT_COMMIT,
    CT_PROPOSAL,
    SENDER_MEMBER,
    WF_PRIVATE_MESSAGE,
    WF_PUBLIC_MESSAGE,
    Add,
    AuthenticatedContent,
    Commit,
    ExternalInit,
    FramedContent,
    FramedContentAuthData,
    GroupContext,
    GroupContextExtensions,
    GroupInfo,
    GroupSecrets,
    KeyPackage,
    LeafNode,
    MLSMessage,
    PreSharedKey,
    PreSharedKeyID,
    ReInit,
    Remove,
    Sender,
    Update,
    UpdatePath,
    decode_proposal,
    encode_content_body,
    read_extensions,
    read_ratchet_tree_nodes,
)
from appliance.marmot.mls.tree import RatchetTree, decrypt_path, derive_path, encrypt_path

from .helpers import cases, h


def _opt(f, *a):
    try:
        return f(*a)
    except ValueError:
        return None


@pytest.mark.parametrize("v", cases("tree-math", suite_field=False))
def test_tree_math(v):
    n = v["n_leaves"]
    assert tm.node_width(n) == v["n_nodes"]
    assert tm.root(n) == v["root"]
    for i in range(v["n_nodes"]):
        assert _opt(tm.left, i) == v["left"][i]
        assert _opt(tm.right, i) == v["right"][i]
        assert _opt(tm.parent, i, n) == v["parent"][i]
        assert _opt(tm.sibling, i, n) == v["sibling"][i]


@pytest.mark.parametrize("v", cases("crypto-basics"))
def test_crypto_basics(v):
    d = v["ref_hash"]
    assert crypto.ref_hash(d["label"].encode(), h(d["value"])) == h(d["out"])
    d = v["expand_with_label"]
    assert crypto.expand_with_label(h(d["secret"]), d["label"].encode(), h(d["context"]), d["length"]) == h(d["out"])
    d = v["derive_secret"]
    assert crypto.derive_secret(h(d["secret"]), d["label"].encode()) == h(d["out"])
    d = v["derive_tree_secret"]
    assert crypto.derive_tree_secret(h(d["secret"]), d["label"].encode(), d["generation"], d["length"]) == h(d["out"])
    d = v["sign_with_label"]
    assert crypto.verify_with_label(h(d["pub"]), d["label"].encode(), h(d["content"]), h(d["signature"]))
    assert crypto.sign_with_label(h(d["priv"]), d["label"].encode(), h(d["content"])) == h(d["signature"])
    assert not crypto.verify_with_label(h(d["pub"]), d["label"].encode(), h(d["content"]) + b"x", h(d["signature"]))
    d = v["encrypt_with_label"]
    label, ctx = d["label"].encode(), h(d["context"])
    assert crypto.decrypt_with_label(h(d["priv"]), label, ctx, h(d["kem_output"]), h(d["ciphertext"])) == h(
        d["plaintext"])
    kem_output, ct = crypto.encrypt_with_label(h(d["pub"]), label, ctx, h(d["plaintext"]))
    assert crypto.decrypt_with_label(h(d["priv"]), label, ctx, kem_output, ct) == h(d["plaintext"])


@pytest.mark.parametrize("v", cases("deserialization", suite_field=False))
def test_deserialization(v):
    header = h(v["vlbytes_header"])
    r = Reader(header)
    assert r.varint() == v["length"]
    r.finish()


def test_deserialization_rejects_non_minimal_and_reserved_prefixes():
    for bad in (b"\x40\x01", b"\x80\x00\x00\x3f", b"\xc0\x00\x00\x00\x00\x00\x00\x01"):
        with pytest.raises(DecodeError):
            Reader(bad).varint()


@pytest.mark.parametrize("v", cases("secret-tree"))
def test_secret_tree(v):
    sd = v["sender_data"]
    key, nonce = ks.sender_data_key_nonce(h(sd["sender_data_secret"]), h(sd["ciphertext"]))
    assert (key, nonce) == (h(sd["key"]), h(sd["nonce"]))
    tree = SecretTree(h(v["encryption_secret"]), len(v["leaves"]))
    for leaf, gens in enumerate(v["leaves"]):
        for g in gens:
            assert tree.key_for(leaf, APPLICATION, g["generation"]) == (h(g["application_key"]),
                                                                        h(g["application_nonce"]))
            assert tree.key_for(leaf, HANDSHAKE, g["generation"]) == (h(g["handshake_key"]), h(g["handshake_nonce"]))


@pytest.mark.parametrize("v", cases("key-schedule"))
def test_key_schedule(v):
    init, gid = h(v["initial_init_secret"]), h(v["group_id"])
    for epoch, e in enumerate(v["epochs"]):
        gc = GroupContext(1, 1, gid, epoch, h(e["tree_hash"]), h(e["confirmed_transcript_hash"]), ())
        assert gc.encode() == h(e["group_context"])
        s = ks.advance(init, h(e["commit_secret"]), h(e["psk_secret"]), gc.encode())
        for name in ("joiner_secret", "welcome_secret", "sender_data_secret", "encryption_secret", "exporter_secret",
                     "epoch_authenticator", "external_secret", "confirmation_key", "membership_key",
                     "resumption_psk", "init_secret"):
            assert getattr(s, name) == h(e[name]), name
        assert s.external_keypair()[1] == h(e["external_pub"])
        x = e["exporter"]
        # the vectors' exporter label is the ASCII text of the hex string
        assert ks.exporter(s.exporter_secret, x["label"].encode(), h(x["context"]), x["length"]) == h(x["secret"])
        init = s.init_secret


@pytest.mark.parametrize("v", cases("psk_secret"))
def test_psk_secret(v):
    psks = [(PreSharedKeyID.external(h(p["psk_id"]), h(p["psk_nonce"])), h(p["psk"])) for p in v["psks"]]
    assert ks.psk_secret(psks) == h(v["psk_secret"])


@pytest.mark.parametrize("v", cases("transcript-hashes"))
def test_transcript_hashes(v):
    ac = AuthenticatedContent.decode(h(v["authenticated_content"]))
    assert ac.content.content_type == CT_COMMIT
    confirmed = ks.confirmed_transcript_hash(h(v["interim_transcript_hash_before"]), ac.wire_format,
                                             ac.content.encode(), ac.auth.signature)
    assert confirmed == h(v["confirmed_transcript_hash_after"])
    assert crypto.mac(h(v["confirmation_key"]), confirmed) == ac.auth.confirmation_tag
    assert ks.interim_transcript_hash(confirmed, ac.auth.confirmation_tag) == h(v["interim_transcript_hash_after"])


@pytest.mark.parametrize("v", cases("message-protection"))
def test_message_protection(v):
    gc = GroupContext(1, 1, h(v["group_id"]), v["epoch"], h(v["tree_hash"]), h(v["confirmed_transcript_hash"]), ())
    pub, priv, mkey = h(v["signature_pub"]), h(v["signature_priv"]), h(v["membership_key"])
    sds, es = h(v["sender_data_secret"]), h(v["encryption_secret"])

    def body(content):
        return content.content if content.content_type == CT_APPLICATION else encode_content_body(
            content.content_type, content.content)

    for kind in ("proposal", "commit"):
        m = MLSMessage.decode(h(v[f"{kind}_pub"])).body
        check_membership_tag(m, gc, mkey)
        verify_content(WF_PUBLIC_MESSAGE, m.content, m.auth, gc, pub)
        assert body(m.content) == h(v[kind])
    for kind in ("proposal", "commit", "application"):
        msg = MLSMessage.decode(h(v[f"{kind}_priv"])).body
        content, auth = unprotect_private(msg, SecretTree(es, 2), sds)
        verify_content(WF_PRIVATE_MESSAGE, content, auth, gc, pub)
        assert body(content) == h(v[kind])
    # protect then unprotect with our own code, both framings
    for kind, ct in (("proposal", CT_PROPOSAL), ("commit", CT_COMMIT), ("application", CT_APPLICATION)):
        raw = h(v[kind])
        content_obj = raw if ct == CT_APPLICATION else (decode_proposal(raw) if ct == CT_PROPOSAL
                                                         else Commit.decode(raw))
        content = FramedContent(gc.group_id, gc.epoch, Sender(SENDER_MEMBER, 1), b"", ct, content_obj)
        tag = crypto.random_bytes() if ct == CT_COMMIT else None
        for wf in (WF_PUBLIC_MESSAGE, WF_PRIVATE_MESSAGE):
            if wf == WF_PUBLIC_MESSAGE and ct == CT_APPLICATION:
                continue
            auth = FramedContentAuthData(sign_content(wf, content, gc, priv), tag)
            if wf == WF_PUBLIC_MESSAGE:
                pm = MLSMessage.decode(MLSMessage(wf, protect_public(content, auth, gc, mkey)).encode()).body
                check_membership_tag(pm, gc, mkey)
                got, got_auth = pm.content, pm.auth
            else:
                sender_tree, receiver_tree = SecretTree(es, 2), SecretTree(es, 2)
                pm = protect_private(content, auth, sender_tree, sds, padding=7)
                got, got_auth = unprotect_private(MLSMessage.decode(MLSMessage(wf, pm).encode()).body,
                                                  receiver_tree, sds)
            verify_content(wf, got, got_auth, gc, pub)
            assert body(got) == raw


_MESSAGE_DECODERS = {
    "mls_welcome": MLSMessage.decode,
    "mls_group_info": MLSMessage.decode,
    "mls_key_package": MLSMessage.decode,
    "ratchet_tree": lambda d: decode_exact(d, read_ratchet_tree_nodes),
    "group_secrets": lambda d: decode_exact(d, GroupSecrets.read),
    "add_proposal": lambda d: Add(KeyPackage.decode(d)),
    "update_proposal": lambda d: Update(LeafNode.decode(d)),
    "remove_proposal": lambda d: decode_exact(d, lambda r: Remove(r.u32())),
    "pre_shared_key_proposal": lambda d: PreSharedKey(decode_exact(d, PreSharedKeyID.read)),
    "re_init_proposal": lambda d: decode_exact(d, lambda r: ReInit(r.vl(), r.u16(), r.u16(),
                                                                    tuple(read_extensions(r)))),
    "external_init_proposal": lambda d: decode_exact(d, lambda r: ExternalInit(r.vl())),
    "group_context_extensions_proposal": lambda d: decode_exact(
        d, lambda r: GroupContextExtensions(tuple(read_extensions(r)))),
    "commit": Commit.decode,
    "public_message_application": MLSMessage.decode,
    "public_message_proposal": MLSMessage.decode,
    "public_message_commit": MLSMessage.decode,
    "private_message": MLSMessage.decode,
}


def _reencode(obj) -> bytes:
    from appliance.marmot.mls.structs import encode_ratchet_tree
    if isinstance(obj, list):
        return encode_ratchet_tree(obj)
    if hasattr(obj, "encode_body"):
        return obj.encode_body()
    return obj.encode()


def _drop_encoding_caches(obj) -> None:
    """Forget the parsed bytes LeafNode and KeyPackage keep, so encode() must rebuild them from fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj.__dict__.pop("_enc", None)
        for f in dataclasses.fields(obj):
            _drop_encoding_caches(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _drop_encoding_caches(item)


@pytest.mark.parametrize("v", cases("messages", suite_field=False))
def test_messages_roundtrip_byte_exact(v):
    assert set(v) <= set(_MESSAGE_DECODERS), set(v) - set(_MESSAGE_DECODERS)
    for name, hexdata in v.items():
        data = h(hexdata)
        obj = _MESSAGE_DECODERS[name](data)
        assert _reencode(obj) == data, name
        _drop_encoding_caches(obj)
        assert _reencode(obj) == data, f"{name} re-encoded from its fields"
        if len(data) > 1:
            with pytest.raises(DecodeError):
                _MESSAGE_DECODERS[name](data[:-1])
    kp = MLSMessage.decode(h(v["mls_key_package"])).body
    if kp.cipher_suite == 1:  # the file mixes suites; parsing is suite-independent, signatures are not
        verify_key_package(kp)


@pytest.mark.parametrize("v", cases("welcome"))
def test_welcome(v):
    kp = MLSMessage.decode(h(v["key_package"])).body
    w = MLSMessage.decode(h(v["welcome"])).body
    ref = crypto.make_key_package_ref(kp.encode())
    entry = next(s for s in w.secrets if s.new_member == ref)
    ct = entry.encrypted_group_secrets
    gs = decode_exact(crypto.decrypt_with_label(h(v["init_priv"]), b"Welcome", w.encrypted_group_info,
                                                ct.kem_output, ct.ciphertext), GroupSecrets.read)
    psk_secret = ks.psk_secret([])
    key, nonce = ks.welcome_key_nonce(crypto.derive_secret(crypto.extract(gs.joiner_secret, psk_secret), b"welcome"))
    gi = decode_exact(crypto.aead_open(key, nonce, b"", w.encrypted_group_info), GroupInfo.read)
    crypto.require_signature(h(v["signer_pub"]), b"GroupInfoTBS", gi.tbs(), gi.signature, "GroupInfo")
    secrets = ks.from_joiner(gs.joiner_secret, psk_secret, gi.group_context.encode())
    assert crypto.mac(secrets.confirmation_key, gi.group_context.confirmed_transcript_hash) == gi.confirmation_tag


@pytest.mark.parametrize("v", cases("tree-operations"))
def test_tree_operations(v):
    tree = RatchetTree.decode(h(v["tree_before"]))
    assert tree.tree_hash() == h(v["tree_hash_before"])
    p = decode_proposal(h(v["proposal"]))
    if isinstance(p, Add):
        tree.add_leaf(p.key_package.leaf_node)
    elif isinstance(p, Update):
        tree.update_leaf(v["proposal_sender"], p.leaf_node)
    elif isinstance(p, Remove):
        tree.remove_leaf(p.removed)
    else:
        raise AssertionError(f"unexpected proposal {p!r}")
    assert tree.encode() == h(v["tree_after"])
    assert tree.tree_hash() == h(v["tree_hash_after"])


@pytest.mark.parametrize("v", cases("tree-validation"))
def test_tree_validation(v):
    tree = RatchetTree.decode(h(v["tree"]))
    assert [tree.tree_hash(i) for i in range(len(tree.nodes))] == [h(x) for x in v["tree_hashes"]]
    assert [tree.resolution(i) for i in range(len(tree.nodes))] == v["resolutions"]
    tree.verify_parent_hashes()
    tree.verify_leaves(h(v["group_id"]))


@pytest.mark.parametrize("v", cases("treekem"))
def test_treekem(v):
    tree = RatchetTree.decode(h(v["ratchet_tree"]))
    tree.verify_parent_hashes()
    gid, epoch, cth = h(v["group_id"]), v["epoch"], h(v["confirmed_transcript_hash"])
    privs = {}
    for leaf in v["leaves_private"]:
        i = leaf["index"]
        mine = {2 * i: h(leaf["encryption_priv"])}
        assert crypto.hpke_public(mine[2 * i]) == tree.nodes[2 * i].encryption_key
        for ps in leaf["path_secrets"]:
            priv, pub = crypto.derive_keypair(crypto.derive_secret(h(ps["path_secret"]), b"node"))
            assert tree.nodes[ps["node"]].encryption_key == pub
            mine[ps["node"]] = priv
        privs[i] = mine
    for up in v["update_paths"]:
        sender = up["sender"]
        path = decode_exact(h(up["update_path"]), UpdatePath.read)
        after = tree.copy()
        fdp = after.filtered_direct_path(sender)
        assert len(fdp) == len(path.nodes)
        parent_hash = after.set_path(sender, [(fdp[k][0], n.encryption_key) for k, n in enumerate(path.nodes)])
        assert path.leaf_node.parent_hash == parent_hash
        after.set_node(2 * sender, path.leaf_node)
        assert after.tree_hash() == h(up["tree_hash_after"])
        after.verify_parent_hashes()
        ctx = GroupContext(1, 1, gid, epoch, after.tree_hash(), cth, ()).encode()
        for i, mine in privs.items():
            if i == sender:
                assert up["path_secrets"][i] is None
                continue
            _, commit_secret, secret = decrypt_path(after, fdp, path.nodes, i, mine, ctx, ())
            assert secret == h(up["path_secrets"][i])
            assert commit_secret == h(up["commit_secret"])
        # and a fresh path of our own from the same sender decrypts to the same commit secret for everyone
        ours = tree.copy()
        secrets_, keys, commit_secret = derive_path(len(fdp), crypto.random_bytes())
        ours.set_path(sender, [(fdp[k][0], keys[k][1]) for k in range(len(fdp))])
        ctx2 = GroupContext(1, 1, gid, epoch + 1, ours.tree_hash(), cth, ()).encode()
        nodes = encrypt_path(ours, fdp, secrets_, [k[1] for k in keys], ctx2, ())
        for i, mine in privs.items():
            if i != sender:
                assert decrypt_path(ours, fdp, nodes, i, mine, ctx2, ())[1] == commit_secret


def _passive(v):
    kp = MLSMessage.decode(h(v["key_package"])).body
    secrets = KeyPackageSecrets(kp, h(v["init_priv"]), h(v["encryption_priv"]), h(v["signature_priv"]))
    assert crypto.hpke_public(secrets.init_priv) == kp.init_key
    assert crypto.hpke_public(secrets.encryption_priv) == kp.leaf_node.encryption_key
    assert crypto.signature_public(secrets.signature_priv) == kp.leaf_node.signature_key
    psks = {h(p["psk_id"]): h(p["psk"]) for p in v["external_psks"]}
    group = join_from_welcome(h(v["welcome"]), secrets, ratchet_tree=h(v["ratchet_tree"]), psks=psks)
    assert group.epoch_authenticator == h(v["initial_epoch_authenticator"])
    state = group.to_bytes()
    for e in v["epochs"]:
        group = Group.from_bytes(state)  # state goes in and out as bytes between epochs
        for p in e["proposals"]:
            group = group.process(h(p), psks=psks).group
        group = group.process(h(e["commit"]), psks=psks).group
        assert group.epoch_authenticator == h(e["epoch_authenticator"])
        state = group.to_bytes()


@pytest.mark.parametrize("v", cases("passive-client-welcome"))
def test_passive_client_welcome(v):
    _passive(v)


@pytest.mark.parametrize("v", cases("passive-client-handling-commit"))
def test_passive_client_handling_commit(v):
    _passive(v)


@pytest.mark.parametrize("v", cases("passive-client-random"))
def test_passive_client_random(v):
    _passive(v)
