"""Stores of lease-ipam reservations: ``base.Store`` is the interface, ``local.LocalStore`` the file store."""
