"""Cross-check against ts-mls, an independent RFC 9420 implementation (npm), run under Node.js.

Needs `node` and `npm install --prefix tests/marmot/interop` (ts-mls 1.6.4 and its noble crypto);
skips with that reason otherwise. ts-mls 1.6.4 frames the GroupInfo external_pub extension as the
bare key where RFC 9420 (and OpenMLS) use HPKEPublicKey<V>; each side is handed the other's form by
its own signer so the rest can be compared. Checked in both directions:

- ts-mls members process *our* External Commit carrying an external PSK derived through the MLS
  exporter: same epoch, epoch authenticator and exporter output; application messages both ways;
  a wrong PSK value is refused by ts-mls too;
- *ts-mls's* External Commit is processed by our members with the same results;
- ts-mls joins our group from our Welcome (its KeyPackage added by our Commit).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance.marmot.mls import DecodeError, DecryptError, Extension, Group, create_key_package, external_join, join_from_welcome
from appliance.marmot.mls.structs import EXT_EXTERNAL_PUB, EXT_RATCHET_TREE, WF_GROUP_INFO, MLSMessage

INTEROP = Path(__file__).resolve().parent / "interop"


class TsMls:
    def __init__(self):
        self.proc = subprocess.Popen(["node", str(INTEROP / "tsmls_driver.mjs")], cwd=INTEROP, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if not answer.pop("ok"):
            raise RuntimeError(answer["error"])
        return answer

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def tsmls():
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not (INTEROP / "node_modules" / "ts-mls").is_dir():
        pytest.skip("ts-mls not installed: run `npm install --prefix tests/marmot/interop`")
    driver = TsMls()
    yield driver
    driver.close()


def psk_id_for(group_info: bytes) -> bytes:
    context = MLSMessage.decode(group_info).body.group_context
    return b"\x1f" + b"marmot.multi-device.join-psk.v1" + hashlib.sha256(context.encode()).digest()


def test_tsmls_processes_our_external_commit_with_exporter_psk(tsmls):
    tsmls("create", group_id=b"ts-group".hex(), members=["alice", "bob"])
    group_info = bytes.fromhex(tsmls("group_info", who="bob", rfc=True)["group_info"])
    psk_id = psk_id_for(group_info)
    psk = bytes.fromhex(tsmls("export", who="alice", label="marmot", context=psk_id.hex(), length=32)["secret"])
    # a wrong PSK value: ts-mls refuses the commit too
    _, bad = external_join(group_info, b"device", external_psks={psk_id: b"\x01" * 32})
    with pytest.raises(RuntimeError, match="confirmation tag"):  # refused for the PSK, not for something else
        tsmls("process", who="alice", message=bad.hex(), psk_values={psk_id.hex(): psk.hex()})
    joiner, commit = external_join(group_info, b"device", external_psks={psk_id: psk})
    for who in ("alice", "bob"):
        seen = tsmls("process", who=who, message=commit.hex(), psk_values={psk_id.hex(): psk.hex()})
        assert seen["epoch"] == joiner.epoch
        assert bytes.fromhex(seen["epoch_authenticator"]) == joiner.epoch_authenticator
    exported = tsmls("export", who="bob", label="check", context="0102", length=32)["secret"]
    assert bytes.fromhex(exported) == joiner.export_secret(b"check", b"\x01\x02", 32)
    joiner, ct = joiner.encrypt(b"from python")
    assert bytes.fromhex(tsmls("process", who="alice", message=ct.hex())["data"]) == b"from python"
    ct = bytes.fromhex(tsmls("encrypt", who="bob", data=b"from ts-mls".hex())["message"])
    assert joiner.process(ct).application_data == b"from ts-mls"


def tsmls_style_group_info(group: Group) -> bytes:
    """Our GroupInfo with external_pub as ts-mls 1.6.4 reads it: the bare key, not HPKEPublicKey<V>."""
    exts = [Extension(EXT_RATCHET_TREE, group.tree.encode()), Extension(EXT_EXTERNAL_PUB, group.external_pub())]
    return MLSMessage(WF_GROUP_INFO, group._signed_group_info(group.context, exts, group.confirmation_tag)).encode()


def test_tsmls_external_pub_framing_differs_from_rfc(tsmls):
    """Recorded finding: ts-mls's GroupInfo carries the bare key; we refuse it (RFC 9420 frames it as <V>)."""
    tsmls("create", group_id=b"ts-group-0".hex(), members=["alice"])
    bare = bytes.fromhex(tsmls("group_info", who="alice")["group_info"])
    # Refused either way: a bare 32-byte key whose first byte is 0x1f (1 in 256 keys) reads as a
    # well-framed <V> of 31 bytes, and is then refused as no X25519 key.
    with pytest.raises((DecodeError, DecryptError)):
        external_join(bare, b"device")


def test_we_process_tsmls_external_commit(tsmls):
    alice = Group.create(b"py-group", b"alice")
    kp = create_key_package(b"bob")
    out = alice.commit(add=[kp.key_package])
    alice, bob = out.group, join_from_welcome(out.welcome, kp)
    joined = tsmls("external_join", who="carol", group_info=tsmls_style_group_info(alice).hex())
    commit = bytes.fromhex(joined["message"])
    alice, bob = alice.process(commit).group, bob.process(commit).group
    assert alice.epoch == bob.epoch == joined["epoch"]
    assert alice.epoch_authenticator == bob.epoch_authenticator == bytes.fromhex(joined["epoch_authenticator"])
    ct = bytes.fromhex(tsmls("encrypt", who="carol", data=b"hello".hex())["message"])
    assert alice.process(ct).application_data == b"hello"
    bob, ct = bob.encrypt(b"welcome carol")
    assert bytes.fromhex(tsmls("process", who="carol", message=ct.hex())["data"]) == b"welcome carol"


def test_tsmls_joins_from_our_welcome(tsmls):
    alice = Group.create(b"py-group-2", b"alice")
    kp = bytes.fromhex(tsmls("key_package", who="dave")["key_package"])
    out = alice.commit(add=[kp])
    joined = tsmls("join", who="dave", welcome=out.welcome.hex())
    assert bytes.fromhex(joined["epoch_authenticator"]) == out.group.epoch_authenticator
    # and follows our next commit
    nxt = out.group.commit()
    seen = tsmls("process", who="dave", message=nxt.message.hex())
    assert bytes.fromhex(seen["epoch_authenticator"]) == nxt.group.epoch_authenticator
