"""A qemu VM running Debian's own kernel, for tests this host's kernel cannot run (RDMA, ...)."""
