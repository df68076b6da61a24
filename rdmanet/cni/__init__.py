"""The CNI protocol core (:mod:`rdmanet.cni.core`) and the host operations (:mod:`rdmanet.cni.linux`)
the plugins are built from."""
