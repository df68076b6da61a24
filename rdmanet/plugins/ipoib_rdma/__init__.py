"""ipoib-rdma: an IPoIB child interface of an InfiniBand port in the pod (shared RDMA mode)."""
