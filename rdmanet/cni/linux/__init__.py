"""Host operations: network namespaces, links, sysfs lookups, RDMA netlink."""

from .pyroute2_parts import install as _install_pyroute2_parts

_install_pyroute2_parts()  # before any module here imports pyroute2
