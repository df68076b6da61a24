"""Host operations: network namespaces, links, sysfs lookups, RDMA netlink."""
