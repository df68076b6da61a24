"""The CNI protocol, free of kernel I/O."""
