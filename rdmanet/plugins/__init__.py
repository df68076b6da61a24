"""One package per CNI executable: its config model and its verbs, as short steps over
:mod:`rdmanet.cni.core` and :mod:`rdmanet.cni.linux`."""
