"""rdmanet's operator CLI."""
