"""rdmanet: Multus-compatible RDMA CNI plugins, their IPAM (lease-ipam), the node daemon and the
operator CLI. Layers, lowest first (a lower one never imports a higher one):

``rdmanet.cni.core`` (the CNI protocol) < ``rdmanet.cni.linux`` (host operations) <
``rdmanet.plugins.<plugin>`` and ``rdmanet.ipam`` < ``rdmanet.node`` (shim and daemon) <
``rdmanet.cli``.

This module stays empty: the stdlib-only shim imports ``rdmanet.node`` through it."""
