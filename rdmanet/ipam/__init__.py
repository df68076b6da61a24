"""lease-ipam: whereabouts/host-local compatible IPAM with an embedded crash-safe file store.

Modules: ``config`` (the ipam block -> range sets), ``intervals`` (free-address arithmetic on
ints), ``ranges`` (range / range set with round-robin choice), ``requested`` (runtime-requested
addresses), ``store`` (the store interface and the local store), ``plugin`` (the CNI verbs).
"""
