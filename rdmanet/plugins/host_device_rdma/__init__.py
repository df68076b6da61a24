"""host-device-rdma: move a netdev, PF or SR-IOV VF (and in exclusive mode its RDMA device) into the pod."""
