"""Marmot: MLS groups over Nostr. Pure: state in and out as bytes, no I/O.

    mls/          an RFC 9420 core (cipher suite 0x0001)
    wire          the Marmot binary profile (through the core's QUIC codec)
    proofs        104-byte authorization proofs: kind 450 (0x8009) and kind 452 (0x800a)
    components    app components (0x8003 admin policy, 0x8004 routing) and MDK's 0xf2ee data
    extensions    draft 0xf2f0 (multi-device gate) and 0xf2ef (encrypted device label)
    transport     kind 445 / 444 in 1059 / 30443 / 10051 events
    profile       what the appliance's leaves and groups carry
    device        one account's device: key packages, groups, messages
    multidevice   DRAFT: join PSK, signaling gate, admin authorization, External Commit
    pairing       DRAFT: the sealed, single-use pairing payload
    errors        the error tree (one class per multi-device validation rule)
"""
