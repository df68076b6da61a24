"""rdmanet CNI plugins: the protocol core, host operations and the plugins themselves."""
