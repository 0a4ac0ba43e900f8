"""Backends: where a ``TrainableModel`` is served and trained (``base.Backend``, ``local``, ``remote``)."""
