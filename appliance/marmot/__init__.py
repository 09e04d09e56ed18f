"""Marmot group tooling: authorization proofs, app components and extensions, the Nostr transport,
the draft multi-device pairing payload. Pure: state in and out as bytes, no I/O.

The MLS core these build on lives in `appliance.marmot.mls`.
"""
