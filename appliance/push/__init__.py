"""NIP-PL push leases: pure validation (descriptor, tags, plaintext, grammar,
acceptance).  No I/O lives in this package's validation modules."""
