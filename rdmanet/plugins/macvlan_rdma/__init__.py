"""macvlan-rdma: a macvlan sub-interface of an RDMA NIC port, aware of the RDMA device it shares."""
