"""The operator CLI, ``rdmanet``: demo, daemon, doctor, ipam ls/reconcile/plan, version."""
