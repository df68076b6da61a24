"""The CNI bin-dir launchers (:mod:`rdmanet.node.launcher`) and the node daemon they talk to
(:mod:`rdmanet.node.daemon`). See docs/architecture.md."""
