"""The CNI bin-dir launchers (:mod:`shim.launcher`) and the node daemon they talk to
(:mod:`shim.daemon`). See DESIGN.md "Executables" and "Speed"."""
