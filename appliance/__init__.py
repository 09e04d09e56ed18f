"""The appliance: a self-hosted Nostr relay with a NIP-PL push executor, in one process."""

__version__ = "0.1.0"
